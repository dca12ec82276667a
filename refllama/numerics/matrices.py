"""Weights that are not arrays (kept quantized, in float16, in the file's form, or several joined as one) multiply as
arrays do: `x @ w.T` calls `w.matmul(x)`, so `layers.linear` is one line for every backend and numerics."""

import functools

import numpy as np

from .. import layers
from ..formats.ggml_types import GGMLType, QuantizedTensor
from ..layers import linear
from ..xp import Placement


class WeightMatrix:
    """The protocol: a [N, K] weight with `shape`, `matmul(x)` ([T, K] -> [T, N]) and, where rows are read
    (embeddings), `w[rows]`; `x @ w.T` is `w.matmul(x)`."""

    __array_ufunc__ = None  # NumPy defers to __rmatmul__ instead of treating the object as an array

    @property
    def T(self):
        return _Transposed(self)

    def row_ids(self, rows):
        """Embedding rows asked for as a checked int64 [T] (a kernel, or NumPy's negative indices, would not)."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.shape[0]):
            raise IndexError(f"rows {rows.min()}..{rows.max()} asked of a {self.shape[0]}-row matrix")
        return rows


class _Transposed:
    __array_ufunc__ = None  # makes `ndarray @ this` defer to __rmatmul__
    __array_priority__ = 1000  # and CuPy's

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
        return [FusedPart(self, int(a), int(b)) for a, b in zip(starts[:-1], starts[1:], strict=True)]

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


FUSED = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"), ("attn_qkv", "attn_gate"),
         ("ssm_beta", "ssm_alpha"), ("ffn_gate_shexp", "ffn_up_shexp"))  # a layer's products of one input (linear
# attention's four: two pairs, each of one type in llama.cpp's quantized files)
PAIRED = ("ffn_gate_exps", "ffn_up_exps")  # the experts' matrices of one input, joined for a decode step (Paired)


class Stack(tuple):
    """A layer's matrices of one 3-D tensor (experts, or heads: DeepSeek's k_b and v_b), with `whole`, all of them
    joined, made once: a decode step's per-head products multiply every head's matrix."""

    pair = None  # the Paired the layer's gate and up experts share

    @functools.cached_property
    def whole(self):
        return self[0].join(list(self))


class Paired:
    """A layer's gate and up experts (Stacks): one token's chosen experts of both multiply as one joined matrix, one
    kernel call, as Fused joins a dense layer's gate and up; the second of the two products takes its half of it
    (the whole product is kept until it has)."""

    def __init__(self, gate, up):
        self.gate, self.up = gate, up
        self.key = self.out = None
        self.left = 0

    def product(self, x, ids, mats, product):  # [1, in], [1, K] -> [1, K, out] of `mats` (gate or up); or None
        if self.key is None or self.key[0] is not x or self.key[1] is not ids:
            chosen = ids[0].tolist()
            whole = self.gate[0].join([self.gate[e] for e in chosen] + [self.up[e] for e in chosen])
            if whole is None:
                return None
            self.key, self.out, self.left = (x, ids), product(x, whole).reshape(2, len(chosen), -1), 2
        out = self.out[0 if mats is self.gate else 1]
        self.left -= 1
        if self.left == 0:
            self.key = self.out = None
        return out[None]


def mul_mat_id(x, mats, ids, product=linear):  # [T, K, in] or [T, in], E matrices, [T, K] ids -> [T, K, out]
    """layers.mul_mat_id, but one token's K experts' matrices joined, where they can be (`join`: their blocks side by
    side, by reference), and multiplied in one kernel call, not K: by its one row where the K slots read it
    (x [1, in]: the gate and up products), else each expert's rows by its slot's own row (x [1, K, in]: the down
    products), where the joined matrix can (`matmul_parts`). Each row's products are those of its own matrix."""
    join = getattr(mats[0], "join", None)
    if join is not None and len(x) == 1:
        pair = getattr(mats, "pair", None)
        if pair is not None and x.ndim == 2:  # the gate and up experts, joined (Paired)
            y = pair.product(x, ids, mats, product)
            if y is not None:
                return y
        chosen = ids[0].tolist()
        every = isinstance(mats, Stack) and chosen == list(range(len(mats)))  # every head's (per-head products)
        whole = mats.whole if every else join([mats[e] for e in chosen])
        if whole is not None and x.ndim == 2:
            return product(x, whole).reshape(1, ids.shape[1], -1)
        if whole is not None and hasattr(whole, "matmul_parts") and whole.in_quads():
            return whole.matmul_parts(x[0]).reshape(1, ids.shape[1], -1)
    quantize = getattr(mats[0], "quantize_rows", None)
    if quantize is not None and x.ndim == 2 and product is not linear:  # a batch's gate and up (numerics ggml):
        q = quantize(x)  # every token's row quantized once, not once an expert and product; layers.mul_mat_id's
        tokens = np.arange(len(x))[:, None]  # grouping then hands each expert its rows' token ids
        return layers.mul_mat_id(tokens, mats, ids, lambda at, w: w.matmul_rows(q, at[:, 0]))
    return layers.mul_mat_id(x, mats, ids, product)


def fuse_layer(lw, concat):
    """Replace each group of FUSED in a layer's weights by parts of one matrix, where `concat` can join them (it
    returns None where it cannot: different types or widths); each 3-D tensor's matrices by a Stack, the gate and up
    experts' Paired."""
    for names in FUSED:
        if all(n in lw for n in names):
            whole = concat([lw[n] for n in names])
            if whole is not None:
                lw.update(zip(names, Fused(whole, [lw[n].shape[0] for n in names]).parts(), strict=True))
    for name, mats in lw.items():
        if isinstance(mats, tuple) and mats and hasattr(mats[0], "join"):
            lw[name] = Stack(mats)
    if all(isinstance(lw.get(n), Stack) for n in PAIRED):
        gate, up = (lw[n] for n in PAIRED)
        gate.pair = up.pair = Paired(gate, up)


SCRATCH_VALUES = 64 << 20  # float32 values (256 MiB): every matrix of an 8B model but the vocabulary's fits whole
CHUNK = 1024  # rows converted per call of the converter
BLOCK_ROWS = 256  # a product in row blocks cuts at multiples of this: BLAS's kernels take rows in groups, and a block
# that ends inside a group sums its last rows in another order


class Scratch:
    """One float32 buffer that the file-form matrices of a model convert into, each in turn; allocated at the size
    of the largest conversion (at most SCRATCH_VALUES) and reused for every product. `xp`: its array module (the
    GPU's 16-bit matrices widen into one on the device, refllama.numerics.gpu)."""

    def __init__(self, xp=np):
        self.xp, self.buf = xp, xp.empty(0, np.float32)

    def take(self, shape):
        n = shape[0] * shape[1]
        if n > len(self.buf):
            self.buf = None  # the smaller one freed before the larger is allocated
            self.buf = self.xp.empty(n, np.float32)
        return self.buf[:n].reshape(shape)


class FileMatrix(WeightMatrix):
    """A [N, K] weight in its file's form (refllama.formats.ggml_types.QuantizedTensor: a memory map of GGUF bytes of
    any type or of a safetensors' float16/bfloat16) for the float32 arithmetic: a product converts the matrix to
    float32 in the model's scratch and multiplies that, so the model is never held in float32 whole, and each
    product is the one a float32 copy would give. A matrix larger than the scratch (the vocabulary's at 7B and up) is
    converted and multiplied in blocks of whole BLOCK_ROWS groups, which BLAS sums as it sums the whole matrix
    (checked on SmolLM2's 49152-row vocabulary; a vocabulary not a multiple of BLOCK_ROWS may differ in its last
    rows by BLAS's rounding)."""

    def __init__(self, stored, scratch):
        self.stored, self.scratch, self.shape = stored, scratch, tuple(stored.shape)
        self.block = max(BLOCK_ROWS, SCRATCH_VALUES // self.shape[1] // BLOCK_ROWS * BLOCK_ROWS)  # rows at once

    def float32(self, a, b):  # rows a:b -> [b - a, K] float32 in the scratch, converted CHUNK rows at a time
        out = self.scratch.take((b - a, self.shape[1]))
        for c in range(a, b, CHUNK):  # bounds the converter's temporaries (gguf-py's dequantize makes several)
            self.stored.rows(slice(c, min(c + CHUNK, b))).to_float32(out[c - a:c - a + CHUNK])
        return out

    def matmul(self, x):  # [T, K] -> [T, N]
        N = self.shape[0]
        if N <= self.block:
            return x @ self.float32(0, N).T
        out = np.empty((len(x), N), np.float32)
        for a in range(0, N, self.block):
            b = min(a + self.block, N)
            out[:, a:b] = x @ self.float32(a, b).T
        return out

    def __getitem__(self, rows):  # embedding lookup: [T] -> [T, K] float32, only those rows converted
        return self.stored.rows(self.row_ids(rows)).to_float32()


FILE_FORMS = frozenset(GGMLType) - {GGMLType.F32}  # the types a matrix stays in; F32 matrices are float32 already


FLOAT32_AT_LOAD = 4 << 30  # a model whose float32 weights take up to this is converted at load, as a fast reference


class FilePlacement(Placement):
    """Weights for the float32 arithmetic on NumPy. A model whose weights take more than FLOAT32_AT_LOAD in float32
    (1B parameters and up) keeps every matrix in its file's form (FileMatrix), all sharing one scratch: a conversion
    at every product, but never the model in float32 whole. A smaller one is converted to float32 at load, once, and
    multiplies faster: the products are the same. `in_file` (True, False) overrides the size rule."""

    def __init__(self, in_file=None):
        super().__init__()
        self.scratch, self.in_file = Scratch(), in_file

    @property
    def keep(self):
        return FILE_FORMS if self.in_file else frozenset()

    def plan(self, float32_bytes):
        if self.in_file is None:
            self.in_file = float32_bytes > FLOAT32_AT_LOAD

    def __call__(self, a):
        return FileMatrix(a, self.scratch) if isinstance(a, QuantizedTensor) else a
