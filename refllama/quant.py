"""Quantized weights that stay quantized, and the Numba kernels that multiply by them (`--backend numba`).

Every supported GGUF type is repacked once, at load, into one of two forms that keep its bits:
  4-bit (Q4_0, Q4_1, Q4_K): codes 0..15 packed two per byte, for each group of 32 values byte j holding
      value j (low nibble) and value j+16 (high); per group a float32 scale and offset:
      w = scale * code + offset  (Q4_0: offset = -8 * d; Q4_1: offset = m; Q4_K: 8 groups per 256-block,
      scale = d * sc, offset = -dmin * min, its nibbles reordered into the layout above);
  8-bit (Q8_0, Q6_K): int8 codes and a float32 scale per group (32 for Q8_0; 16 for Q6_K, codes q - 32).
Decode reads 4.5 to 8.5 bits per weight instead of float32's 32: it is memory-bound, so that is the speed.
A QuantMatrix `w` multiplies as `x @ w.T`, so `layers.linear` is the same code for every backend.
"""

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf.quants import Q4_K
from numba import njit, prange

QUANTIZED = frozenset((QT.Q4_0, QT.Q4_1, QT.Q4_K, QT.Q8_0, QT.Q6_K))


def _f16(a):
    return np.ascontiguousarray(a).view(np.float16).astype(np.float32)


def _pack_nibbles(codes):  # [N, K] values 0..15 -> [N, K/2], per 32-group: byte j = code j | code j+16 << 4
    n, k = codes.shape
    g = codes.reshape(n, k // 32, 2, 16)
    return (g[:, :, 0] | (g[:, :, 1] << 4)).reshape(n, k // 2).astype(np.uint8)


def repack(raw, qtype, shape):
    """The kernel form of a GGUF tensor's raw bytes [N, row bytes]: ('q4', packed, scale, offset) or
    ('q8', codes, scale, group)."""
    n, k = shape
    if qtype in (QT.Q4_0, QT.Q4_1):
        blocks = raw.reshape(n, k // 32, -1)
        d = _f16(blocks[..., 0:2]).reshape(n, -1)
        if qtype == QT.Q4_0:
            return ("q4", np.ascontiguousarray(blocks[..., 2:]).reshape(n, k // 2), d, -8.0 * d)
        return ("q4", np.ascontiguousarray(blocks[..., 4:]).reshape(n, k // 2), d, _f16(blocks[..., 2:4]).reshape(n, -1))
    if qtype == QT.Q4_K:
        blocks = raw.reshape(n * k // 256, 144)
        d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])  # [n_blocks, 1]
        sc, mn = Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))  # [n_blocks, 8] each
        qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
        codes = (qs & 15).reshape(n, k)  # value order: each 64 = 32 low nibbles, then 32 high
        return ("q4", _pack_nibbles(codes), (d * sc).reshape(n, -1), (-dmin * mn).reshape(n, -1))
    if qtype == QT.Q8_0:
        blocks = raw.reshape(n, k // 32, 34)
        return ("q8", np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(n, k), _f16(blocks[..., :2]).reshape(n, -1), 32)
    if qtype == QT.Q6_K:
        blocks = raw.reshape(n * k // 256, 210)
        ql, qh = blocks[:, :128], blocks[:, 128:192]
        scale = (blocks[:, 192:208].view(np.int8).astype(np.float32) * _f16(blocks[:, 208:210])).reshape(n, -1)
        lo = (ql.reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 15  # [b, half, 2, 64]
        hi = (qh.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3  # [b, half, 4, 32]
        codes = (lo.reshape(-1, 2, 4, 32) | (hi << 4)).astype(np.int8) - np.int8(32)
        return ("q8", codes.reshape(n, k), scale, 16)
    raise ValueError(f"no kernel for {qtype.name}")


@njit(parallel=True, fastmath=True, cache=True)
def matmul_q4(x, packed, scale, offset):  # [T, K] f32, [N, K/2] u8, [N, K/32], [N, K/32] -> [T, N] = x @ W.T
    T, K = x.shape
    N, nb = scale.shape
    xsum = np.zeros((T, nb), np.float32)  # sum of x over each group, for the offsets
    for t in range(T):
        for b in range(nb):
            for j in range(32):
                xsum[t, b] += x[t, b * 32 + j]
    out = np.empty((T, N), np.float32)
    for r in prange(N):
        for t in range(T):
            acc = np.float32(0.0)
            for b in range(nb):
                s = np.float32(0.0)
                for j in range(16):  # by far the most time is spent here: unpack two codes, two multiply-adds
                    q = packed[r, b * 16 + j]
                    s += np.float32(q & 15) * x[t, b * 32 + j] + np.float32(q >> 4) * x[t, b * 32 + 16 + j]
                acc += scale[r, b] * s + offset[r, b] * xsum[t, b]
            out[t, r] = acc
    return out


@njit(parallel=True, fastmath=True, cache=True)
def matmul_q8(x, codes, scale, group):  # [T, K] f32, [N, K] i8, [N, K/group] -> [T, N] = x @ W.T
    T, K = x.shape
    N = codes.shape[0]
    out = np.empty((T, N), np.float32)
    for r in prange(N):
        for t in range(T):
            acc = np.float32(0.0)
            for g in range(K // group):
                s = np.float32(0.0)
                for j in range(group):
                    s += np.float32(codes[r, g * group + j]) * x[t, g * group + j]
                acc += scale[r, g] * s
            out[t, r] = acc
    return out


class QuantMatrix:
    """A [N, K] weight kept quantized. `x @ w.T` runs the Numba kernel; `w[rows]` dequantizes rows."""

    def __init__(self, raw, qtype, shape):
        self.qtype, self.shape = qtype, tuple(shape)
        self.form = repack(raw, qtype, shape)

    @property
    def T(self):
        return _Transposed(self)

    @property
    def nbytes(self):
        return sum(a.nbytes for a in self.form[1:] if isinstance(a, np.ndarray))

    def matmul(self, x):  # [T, K] -> [T, N]
        x = np.ascontiguousarray(x, dtype=np.float32)
        kind, a, scale, extra = self.form
        return matmul_q4(x, a, scale, extra) if kind == "q4" else matmul_q8(x, a, scale, extra)

    def __getitem__(self, rows):  # embedding lookup: [T] -> [T, K] float32
        kind, a, scale, extra = self.form
        rows = np.asarray(rows)
        n, k = len(rows), self.shape[1]
        if kind == "q4":
            p = a[rows].reshape(n, k // 32, 16)
            codes = np.concatenate([p & 15, p >> 4], axis=-1).astype(np.float32)  # [n, groups, 32]
            return (codes * scale[rows][..., None] + extra[rows][..., None]).reshape(n, k)
        return (a[rows].reshape(n, -1, extra).astype(np.float32) * scale[rows][..., None]).reshape(n, k)


class _Transposed:
    __array_ufunc__ = None  # makes `ndarray @ this` defer to __rmatmul__

    def __init__(self, w):
        self.w = w

    def __rmatmul__(self, x):
        return self.w.matmul(x)


def warm_up(kinds=("q4", "q8")):
    """Compile (or load from Numba's cache) every kernel once; returns nothing, costs the compile time."""
    x = np.ones((1, 32), np.float32)
    if "q4" in kinds:
        matmul_q4(x, np.zeros((1, 16), np.uint8), np.ones((1, 1), np.float32), np.zeros((1, 1), np.float32))
    if "q8" in kinds:
        matmul_q8(x, np.zeros((1, 32), np.int8), np.ones((1, 1), np.float32), 32)
