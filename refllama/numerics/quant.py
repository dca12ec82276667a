"""Quantized weights that stay quantized, and the Numba kernels that multiply by them (`--backend numba`).

Every supported GGUF type is repacked once, at load, into one of two forms that keep its bits:
  4-bit (Q4_0, Q4_1, Q4_K): codes 0..15 packed two per byte, for each group of 32 values byte j holding
      value j (low nibble) and value j+16 (high); per group a scale and offset: w = scale * code + offset
      (Q4_0: offset = -8 * d; Q4_1: offset = m; Q4_K: 8 groups per 256-block, scale = d * sc,
      offset = -dmin * min, its nibbles reordered into the layout above);
  8-bit (Q8_0, Q5_0, Q6_K): int8 codes and a scale per group (32 for Q8_0 and Q5_0, codes q - 16 for Q5_0; 16 for
      Q6_K, codes q - 32). Q5_0's 5-bit codes take a byte each: 8.5 bits per weight instead of 5.5, for one kernel.
Scales that GGUF stores as float16 (Q4_0, Q4_1, Q5_0, Q8_0) keep their 16 bits, read through a 65536-entry table
as ggml does; the K-quants' products d * sc are not float16 numbers, so they are float32. Either way the
weights take the GGUF file's bytes, and decode reads 5 to 8.5 bits per weight instead of float32's 32.
A QuantMatrix `w` multiplies as `x @ w.T`, so `layers.linear` is the same code for every backend. One token's
product with a 4-bit form, or an 8-bit one with float16 scales, is a vector loop in LLVM IR (32 float32 lanes,
target-independent); a batch's is a Numba kernel that dequantizes 4 rows at a time for all its tokens.
"""

from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from ..formats.ggml_types import GGMLType as QT
from ..formats.ggml_types import QuantizedTensor, byte_shape
from . import numba_ops
from .ggml_tables import F16_TABLE, blocks, codes, f16, f16_bits, field, k_scales
from .ir import F32, I8, I32, I64, V32F32, V32I8, counted_loop, hsum, load, load_f16, specialize, splat
from .kernel_pages import compile_notice, release_loader_pages, warm_up_steps
from .matrices import FILE_FORMS, FileMatrix, FilePlacement, WeightMatrix, fuse_layer

REPACKED = frozenset((QT.Q4_0, QT.Q4_1, QT.Q4_K, QT.Q5_0, QT.Q8_0, QT.Q6_K))
def as_f32(s, table):
    """A scale as float32: float16 bits (uint16) through the table, float32 as it is."""


@overload(as_f32)
def _as_f32(s, table):
    if isinstance(s, types.Integer):
        return lambda s, table: table[s]
    return lambda s, table: s


class Q4Form(NamedTuple):
    """4-bit codes, two per byte; w = scale * code + offset per group of 32."""

    codes: np.ndarray  # [N, K/2] uint8
    scale: np.ndarray  # [N, K/32] float16 bits (uint16) or float32
    offset: np.ndarray  # [N, K/32], same dtype as scale


class Q8Form(NamedTuple):
    """8-bit codes; w = scale * code per group of `group`."""

    codes: np.ndarray  # [N, K] int8
    scale: np.ndarray  # [N, K/group] float16 bits (uint16) or float32
    group: int


def repack(raw, qtype, shape):
    """The kernel form (Q4Form or Q8Form) of a GGUF tensor's raw bytes [N, row bytes]."""
    n, k = shape
    b = blocks(raw, qtype, shape)  # [n, k/block, block bytes]
    if qtype in (QT.Q4_0, QT.Q4_1):  # the GGUF nibbles as they are, float16 scales kept as their bits
        packed = np.ascontiguousarray(field(b, qtype, "qs")).reshape(n, k // 2)
        d = f16_bits(field(b, qtype, "d"))
        if qtype == QT.Q4_1:
            return Q4Form(packed, d, f16_bits(field(b, qtype, "m")))
        with np.errstate(over="ignore"):  # -8 d is exact in float16 (an exponent step) unless it overflows
            offset = (-8 * F16_TABLE[d]).astype(np.float16)
        if not np.isfinite(offset).all():  # then float32
            return Q4Form(packed, F16_TABLE[d], -8 * F16_TABLE[d])
        return Q4Form(packed, d, offset.view(d.dtype))
    if qtype == QT.Q4_K:  # w = (d * sc) * code - dmin * m, per group of 32
        sc, mn = k_scales(field(b, qtype, "scales"))  # [n, k/256, 8] each
        d, dmin = f16(field(b, qtype, "d"))[..., None], f16(field(b, qtype, "dmin"))[..., None]
        g = codes(b, qtype).view(np.uint8).reshape(n, k // 32, 2, 16)  # per 32: byte j = code j | code j+16 << 4
        packed = (g[:, :, 0] | (g[:, :, 1] << 4)).reshape(n, k // 2).astype(np.uint8)
        return Q4Form(packed, (d * sc).reshape(n, -1), (-dmin * mn).reshape(n, -1))
    if qtype in (QT.Q8_0, QT.Q5_0):  # codes a byte each (Q5_0: q - 16), float16 scales kept as their bits
        return Q8Form(codes(b, qtype).reshape(n, k), f16_bits(field(b, qtype, "d")), 32)
    if qtype == QT.Q6_K:  # codes q - 32, a scale d * sc per 16
        sc = np.ascontiguousarray(field(b, qtype, "scales")).view(np.int8).astype(np.float32)  # [n, k/256, 16]
        return Q8Form(codes(b, qtype).reshape(n, k), (sc * f16(field(b, qtype, "d"))[..., None]).reshape(n, -1), 16)
    raise ValueError(f"no kernel for {qtype.name}")


CHUNKS = 64  # rows are split into this many chunks across threads; each chunk reuses one scratch row


# LLVM IR for the one-token product of an 8-bit form with float16 scales (Q8_0, Q5_0): Numba's loops over these
# fields sum each group of 32 across lanes, 32 multiply-adds then a horizontal sum per group; written as vectors,
# 32 lanes accumulate d * (w * x) over the whole row and are summed once.
@intrinsic
def q8_row_dot(typingctx, w, x, d, nb):
    """(w, x, d, nb) -> float: sum over nb groups of d[g] * sum_j w[g, j] * x[g, j]; w: int8 codes, x: float32,
    d: float16 scales, each an address."""
    def codegen(context, builder, signature, args):
        w, x, d, nb = args
        fma = builder.module.declare_intrinsic("llvm.fma.v32f32", fnty=ir.FunctionType(V32F32, [V32F32] * 3))

        def group(i, acc):
            q = builder.sitofp(load(builder, builder.add(w, builder.mul(i, ir.Constant(I64, 32))), V32I8), V32F32)
            xv = load(builder, builder.add(x, builder.mul(i, ir.Constant(I64, 128))), V32F32)
            scale = splat(builder, load_f16(builder, builder.add(d, builder.mul(i, ir.Constant(I64, 2)))), V32F32)
            return [builder.call(fma, [scale, builder.fmul(q, xv), acc[0]])]

        new, = counted_loop(builder, nb, [ir.Constant(V32F32, None)], group)
        return hsum(builder, new)

    return types.float32(types.int64, types.int64, types.int64, types.int64), codegen


def _q4_row_dot(scale_type):
    """An intrinsic (w, x, xsum, s, o, nb) -> float: sum over nb groups of s[g] * sum_j code[g, j] * x[g, j]
    + o[g] * xsum[g]; w: a 4-bit form's row (16 bytes a group), x and xsum float32, s and o float16 bits
    ("f16") or float32 ("f32"), each an address."""
    scalar, size = (ir.HalfType(), 2) if scale_type == "f16" else (F32, 4)

    def read(builder, base, i):
        v = load(builder, builder.add(base, builder.mul(i, ir.Constant(I64, size))), scalar)
        return builder.fpext(v, F32) if scale_type == "f16" else v

    @intrinsic
    def row_dot(typingctx, w, x, xsum, s, o, nb):
        def codegen(context, builder, signature, args):
            w, x, xsum, s, o, nb = args
            fma = builder.module.declare_intrinsic("llvm.fma.v32f32", fnty=ir.FunctionType(V32F32, [V32F32] * 3))
            fma1 = builder.module.declare_intrinsic("llvm.fma.f32", fnty=ir.FunctionType(F32, [F32] * 3))
            v16 = ir.VectorType(I8, 16)

            def group(i, sums):
                acc, off = sums
                qs = load(builder, builder.add(w, builder.mul(i, ir.Constant(I64, 16))), v16)
                codes = builder.shuffle_vector(builder.and_(qs, ir.Constant(v16, [15] * 16)),
                                               builder.lshr(qs, ir.Constant(v16, [4] * 16)),
                                               ir.Constant(ir.VectorType(I32, 32), list(range(32))))  # j, j + 16
                xv = load(builder, builder.add(x, builder.mul(i, ir.Constant(I64, 128))), V32F32)
                xs = load(builder, builder.add(xsum, builder.mul(i, ir.Constant(I64, 4))), F32)
                return [builder.call(fma, [splat(builder, read(builder, s, i), V32F32),
                                           builder.fmul(builder.uitofp(codes, V32F32), xv), acc]),
                        builder.call(fma1, [read(builder, o, i), xs, off])]

            new, new_off = counted_loop(builder, nb, [ir.Constant(V32F32, None), ir.Constant(F32, 0.0)], group)
            return builder.fadd(hsum(builder, new), new_off)

        return types.float32(*[types.int64] * 6), codegen

    return row_dot


Q4_DOT = None  # the row dot of one scale type, in each copy's globals (MATVEC_Q4, ir.specialize)


def _matvec_q4(x, codes, scale, offset):  # [K] f32, [N, K/2] u8, [N, K/32], [N, K/32] -> [N] = W @ x
    N, K = codes.shape[0], x.shape[0]
    xsum = np.zeros(K // 32, np.float32)  # x summed over each group, for the offsets
    for g in range(K // 32):
        for j in range(32):
            xsum[g] += x[g * 32 + j]
    out = np.empty(N, np.float32)
    n_chunks = min(N, CHUNKS)
    for c in prange(n_chunks):
        w0, x0, xs0, s0, o0 = codes.ctypes.data, x.ctypes.data, xsum.ctypes.data, scale.ctypes.data, offset.ctypes.data
        for r in range(c * N // n_chunks, (c + 1) * N // n_chunks):
            at = r * (K // 32) * scale.itemsize
            out[r] = Q4_DOT(w0 + r * (K // 2), x0, xs0, s0 + at, o0 + at, K // 32)
    return out


MATVEC_Q4 = {np.dtype(dtype): specialize(_matvec_q4, f"matvec_q4_{name}", Q4_DOT=_q4_row_dot(name))  # by scale type
             for dtype, name in ((np.uint16, "f16"), (np.float32, "f32"))}


@njit(parallel=True, cache=True)
def matvec_q8_f16(x, codes, scale):  # [K] f32, [N, K] i8, [N, K/32] float16 bits -> [N] = W @ x
    N, K = codes.shape
    out = np.empty(N, np.float32)
    n_chunks = min(N, CHUNKS)
    for c in prange(n_chunks):
        w0, x0, d0 = codes.ctypes.data, x.ctypes.data, scale.ctypes.data  # taken in the loop: its arrays stay alive
        for r in range(c * N // n_chunks, (c + 1) * N // n_chunks):
            out[r] = q8_row_dot(w0 + r * K, x0, d0 + r * (K // 32) * 2, K // 32)
    return out


@njit(parallel=True, fastmath=True, cache=True)
def matvec_q8(x, codes, scale, group, table):  # [K] f32, [N, K] i8, [N, K/group] -> [N] = W @ x
    K = x.shape[0]
    N = codes.shape[0]
    out = np.empty(N, np.float32)
    n_chunks = min(N, CHUNKS)
    for c in prange(n_chunks):
        tmp = np.empty(K, np.float32)
        for r in range(c * N // n_chunks, (c + 1) * N // n_chunks):
            row = codes[r]
            for i in range(K):  # one straight, vectorizable pass; then a sum per group
                tmp[i] = np.float32(row[i]) * x[i]
            acc = np.float32(0.0)
            for g in range(K // group):
                s = np.float32(0.0)
                for j in range(group):
                    s += tmp[g * group + j]
                acc += as_f32(scale[r, g], table) * s
            out[r] = acc
    return out


def dequant_row(codes, scale, extra, table, r, w):
    """Row r of either form's fields, dequantized into w [K] f32: Q4Form (codes uint8, scale, offset) or Q8Form
    (codes int8, scale, group); the codes' dtype tells which."""


@njit(fastmath=True)
def _row_q4(packed, scale, offset, table, r, w):
    for b in range(scale.shape[1]):
        sc, off = as_f32(scale[r, b], table), as_f32(offset[r, b], table)
        for j in range(16):
            q = packed[r, b * 16 + j]
            w[b * 32 + j] = np.float32(np.int32(q & np.uint8(15))) * sc + off
            w[b * 32 + 16 + j] = np.float32(np.int32(q >> np.uint8(4))) * sc + off


@njit(fastmath=True)
def _row_q8(codes, scale, group, table, r, w):
    for i in range(codes.shape[1]):
        w[i] = np.float32(codes[r, i]) * as_f32(scale[r, i // group], table)


@overload(dequant_row)
def _dequant_row(codes, scale, extra, table, r, w):
    row = _row_q4 if codes.dtype == types.uint8 else _row_q8
    return lambda codes, scale, extra, table, r, w: row(codes, scale, extra, table, r, w)


@njit(fastmath=True, cache=True)
def dequant_rows(codes, scale, extra, table, rows, out):  # rows [T] of either form -> out [T, K] f32
    for i in range(len(rows)):
        dequant_row(codes, scale, extra, table, rows[i], out[i])


@njit(fastmath=True)
def _tile_4x2(X, w, out, r):  # out[:, r:r+4] = X @ w.T for 4 dequantized rows w [4, K]
    """Two tokens at a time against the four rows: 8 sums that stay in registers while K streams by, so each
    load of w or X serves two or four multiply-adds. An odd last token is computed twice (same value)."""
    T, K = X.shape
    N = out.shape[1]
    for t in range(0, T, 2):
        u = min(t + 1, T - 1)
        a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = np.float32(0.0)
        for k in range(K):
            x, y = X[t, k], X[u, k]
            a0 += w[0, k] * x
            a1 += w[1, k] * x
            a2 += w[2, k] * x
            a3 += w[3, k] * x
            b0 += w[0, k] * y
            b1 += w[1, k] * y
            b2 += w[2, k] * y
            b3 += w[3, k] * y
        for i, a, b in ((0, a0, b0), (1, a1, b1), (2, a2, b2), (3, a3, b3)):
            if r + i < N:
                out[t, r + i], out[u, r + i] = a, b


@njit(parallel=True, fastmath=True, cache=True)
def matmul(X, codes, scale, extra, table):  # [T, K] f32, either form of [N, K] -> [T, N] = X @ W.T
    T, K = X.shape
    N = codes.shape[0]
    out = np.empty((T, N), np.float32)
    n_quads = (N + 3) // 4
    n_chunks = min(n_quads, CHUNKS)
    for c in prange(n_chunks):
        w = np.empty((4, K), np.float32)  # 4 rows dequantized, reused for every token
        for g in range(c * n_quads // n_chunks, (c + 1) * n_quads // n_chunks):
            for i in range(4):
                dequant_row(codes, scale, extra, table, min(4 * g + i, N - 1), w[i])
            _tile_4x2(X, w, out, 4 * g)
    return out


class QuantMatrix(WeightMatrix):
    """A [N, K] weight kept quantized. `x @ w.T` runs the Numba kernel; `w[rows]` dequantizes rows."""

    def __init__(self, raw, qtype, shape):
        self.use(qtype, shape, repack(raw, qtype, shape))

    def use(self, qtype, shape, f):
        """Hold form f; one token's kernel and its fields are chosen here, once (matmul runs ~120 times a step)."""
        self.qtype, self.shape, self.form = qtype, tuple(shape), f
        if isinstance(f, Q4Form):
            self.matvec, self.fields = MATVEC_Q4[f.scale.dtype], tuple(f)
        elif f.group == 32 and f.scale.dtype == np.uint16:
            self.matvec, self.fields = matvec_q8_f16, (f.codes, f.scale)
        else:
            self.matvec, self.fields = matvec_q8, (*f, F16_TABLE)

    @property
    def nbytes(self):
        return sum(a.nbytes for a in self.form if isinstance(a, np.ndarray))

    def matmul(self, x):  # [T, K] -> [T, N]
        """Decode (T = 1): the matrix-vector kernel on the packed codes. Prefill: the Numba matmul, which
        dequantizes 4 rows at a time into a small scratch and multiplies them by all T tokens (matrix-matrix)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if len(x) > 1:
            return matmul(x, *self.form, F16_TABLE)
        return self.matvec(x[0], *self.fields)[None]

    def __getitem__(self, rows):  # embedding lookup: [T] -> [T, K] float32
        rows = self.row_ids(rows)
        out = np.empty((len(rows), self.shape[1]), np.float32)
        dequant_rows(*self.form, F16_TABLE, rows, out)
        return out


def concat_quant(ms):
    """One QuantMatrix of the rows of several of one type and width, or None."""
    first = ms[0]

    def same(m):
        return isinstance(m, QuantMatrix) and m.qtype == first.qtype and m.shape[1] == first.shape[1]

    if not all(same(m) for m in ms):
        return None
    arrays = [np.concatenate([m.form[i] for m in ms]) for i in range(2)]
    extra = np.concatenate([m.form[2] for m in ms]) if isinstance(first.form, Q4Form) else first.form[2]
    whole = object.__new__(QuantMatrix)
    whole.use(first.qtype, (sum(m.shape[0] for m in ms), first.shape[1]), type(first.form)(*arrays, extra))
    return whole


@njit(parallel=True, fastmath=True, cache=True)
def matvec_bf16(x, w):  # [K] f32, [N, K] bfloat16 bits (uint16) -> [N] = W @ x
    N, K = w.shape
    out = np.empty(N, np.float32)
    n_chunks = min(N, CHUNKS)
    for c in prange(n_chunks):
        bits = np.empty(K, np.uint32)
        row = bits.view(np.float32)
        for r in range(c * N // n_chunks, (c + 1) * N // n_chunks):
            for i in range(K):  # bfloat16 is the top half of a float32
                bits[i] = np.uint32(w[r, i]) << 16
            acc = np.float32(0.0)
            for i in range(K):
                acc += row[i] * x[i]
            out[r] = acc
    return out


@njit(parallel=True, fastmath=True, cache=True)
def matvec_f16(x, w, table):  # [K] f32, [N, K] float16 bits (uint16), the float16 table -> [N] = W @ x
    N, K = w.shape
    out = np.empty(N, np.float32)
    n_chunks = min(N, CHUNKS)
    for c in prange(n_chunks):
        row = np.empty(K, np.float32)
        for r in range(c * N // n_chunks, (c + 1) * N // n_chunks):
            for i in range(K):
                row[i] = table[w[r, i]]
            acc = np.float32(0.0)
            for i in range(K):
                acc += row[i] * x[i]
            out[r] = acc
    return out


class HalfMatrix(FileMatrix):
    """An F16/BF16 matrix as stored in the file, memory-mapped: one token's product is a Numba kernel reading its 16
    bits per weight once (decode is bound by reading the weights); a batch's converts it to float32 in the scratch
    and multiplies there (FileMatrix)."""

    def __init__(self, stored, scratch):
        super().__init__(stored, scratch)
        self.bits, self.bf16 = stored.raw.view(np.uint16), stored.qtype == QT.BF16  # [N, K]

    def matmul(self, x):  # [T, K] -> [T, N]
        if len(x) > 1:
            return super().matmul(x)
        x = np.ascontiguousarray(x[0], dtype=np.float32)
        return (matvec_bf16(x, self.bits) if self.bf16 else matvec_f16(x, self.bits, F16_TABLE))[None]


class NumbaPlacement(FilePlacement):
    """Weights for the numba backend: matrices of the REPACKED types kept in their GGUF bytes and repacked for the
    kernels as they are read (each memory map dropped once repacked); the other matrices, in a model big enough
    (FilePlacement's size rule), in their file's form (FileMatrix), else float32 NumPy as the rest. `converted`: the
    quantized types without a kernel kept in the file, for a notice."""

    def __init__(self, in_file=None):
        super().__init__(in_file)
        self.converted = set()

    @property
    def keep(self):
        return FILE_FORMS if self.in_file else REPACKED

    def prepare(self, qtypes, cfg):
        """Load the kernels of the file's quantized matrix types and of a step's small steps, before the weights
        are read; then release the pages that only loading them needed."""
        self.converted = {t.name for t in qtypes if t in self.keep - REPACKED - {QT.F16, QT.BF16}}
        with compile_notice():
            warm_up(REPACKED & set(qtypes))
            for qtype in (self.keep - REPACKED) & set(qtypes) & {QT.F16, QT.BF16}:  # HalfMatrix's kernel
                half = QuantizedTensor(np.zeros((2, 256 * 2), np.uint8), qtype, (2, 256))
                _ = np.zeros((1, 256), np.float32) @ HalfMatrix(half, self.scratch).T
            warm_up_steps(numba_ops.OPS, cfg.head_dim)
        release_loader_pages()

    def __call__(self, a):
        if not isinstance(a, QuantizedTensor):
            return a
        if a.qtype in REPACKED:
            return QuantMatrix(a.raw, a.qtype, a.shape)
        return (HalfMatrix if a.qtype in (QT.F16, QT.BF16) else FileMatrix)(a, self.scratch)

    def layer(self, lw):
        fuse_layer(lw, concat_quant)


def warm_up(qtypes):
    """Run each kernel that matrices of these GGUF types use once, on a small zero matrix of each, so that Numba
    compiles it (or loads it from its cache) now rather than at the first token."""
    x = np.zeros((2, 256), np.float32)
    for qtype in qtypes:
        m = QuantMatrix(np.zeros(byte_shape((4, 256), qtype), np.uint8), qtype, (4, 256))
        _ = x[:1] @ m.T, x @ m.T, m[[0]]  # matvec, matmul, rows
