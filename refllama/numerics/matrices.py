"""Weights that are not arrays (kept quantized, in float16, or several joined as one) multiply as arrays do: `x @ w.T`
calls `w.matmul(x)`, so `layers.linear` is one line for every backend and numerics."""

import numpy as np


class WeightMatrix:
    """The protocol: a [N, K] weight with `shape`, `matmul(x)` ([T, K] -> [T, N]) and, where rows are read
    (embeddings), `w[rows]`; `x @ w.T` is `w.matmul(x)`."""

    __array_ufunc__ = None  # NumPy defers to __rmatmul__ instead of treating the object as an array

    @property
    def T(self):
        return _Transposed(self)


class _Transposed:
    __array_ufunc__ = None  # makes `ndarray @ this` defer to __rmatmul__

    def __init__(self, w):
        self.w = w

    def __rmatmul__(self, x):
        return self.w.matmul(x)


class Fused:
    """Matrices that multiply the same input, multiplied as one matrix (q/k/v; gate/up): one kernel call instead of
    three or two per layer. The forward still multiplies each part by name: the first part's product computes them
    all, and each part takes its columns of it (the whole product is kept until every part has taken its own)."""

    def __init__(self, whole, sizes):
        self.whole, self.sizes = whole, sizes
        self.x = self.out = None
        self.left = 0

    def parts(self):
        starts = np.cumsum((0, *self.sizes))
        return [FusedPart(self, int(a), int(b)) for a, b in zip(starts[:-1], starts[1:])]

    def columns(self, x, a, b):  # [T, K] -> [T, b - a]: this part's share of x @ whole.T
        if self.x is not x or self.left == 0:
            self.x, self.out, self.left = x, self.whole.matmul(x), len(self.sizes)
        out = self.out[:, a:b]
        self.left -= 1
        if self.left == 0:
            self.x = self.out = None
        return out


class FusedPart(WeightMatrix):
    def __init__(self, fused, a, b):
        self.fused, self.a, self.b = fused, a, b
        self.shape = (b - a, fused.whole.shape[1])

    def matmul(self, x):
        return self.fused.columns(x, self.a, self.b)


FUSED = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"))  # a layer's products of one input


def fuse_layer(lw, concat):
    """Replace each group of FUSED in a layer's weights by parts of one matrix, where `concat` can join them (it
    returns None where it cannot: different types or widths)."""
    for names in FUSED:
        if all(n in lw for n in names):
            whole = concat([lw[n] for n in names])
            if whole is not None:
                lw.update(zip(names, Fused(whole, [lw[n].shape[0] for n in names]).parts()))
