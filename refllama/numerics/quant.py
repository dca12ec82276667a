"""Quantized weights multiplied in their GGUF bytes, in place, by Numba kernels (`--backend numba`, numerics float32).

A QuantMatrix is the file's blocks (a memory map, or several: a fused matrix's parts are joined by reference, never
copied), so the weights take the file's bytes and loading reads nothing. Every block is unpacked where it is used,
a group of 32 values at a time (block_ir.groups): codes, a scale and for some types an offset, value = scale * code
+ offset, as ggml's dequantize_row_* computes it. One token's product is a vector loop in LLVM IR per row: 32 float32
lanes accumulate fma(scale, code * x, acc) over the whole row, the offsets times x's group sums apart, one horizontal
sum at the end. A batch's product dequantizes TILE_N rows at a time (16; 6 with AVX2) and multiplies them by 16
tokens at once. Every value a product uses is the float32 one gguf-py's dequantize gives; only the order of the
float32 additions is the kernel's, the same on every x86 host.
A QuantMatrix `w` multiplies as `x @ w.T`, so `layers.linear` is the same code for every backend.
"""

import itertools
from functools import partial

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ..formats.ggml_types import BLOCK_SIZES, QuantizedTensor, byte_shape
from ..formats.ggml_types import GGMLType as QT
from . import numba_ops
from .block_ir import GROUPS, broadcast_lane, groups, prefetch_block, rows_ahead
from .ir import F32, I64, V32F32, compile_features, counted_loop, hsum, load, prefetch, specialize, splat
from .kernel_pages import compile_notice, map_experts, release_loader_pages, warm_up_steps
from .matrices import FILE_FORMS, FileMatrix, FilePlacement, WeightMatrix, fuse_layer

KERNEL_TYPES = frozenset(GROUPS)  # the GGUF types with kernels here
N_READ = 4  # rows one token's product reads side by side (row_quad)
WIDE = "avx512f" in compile_features()  # 32 vector registers of 16 float32 lanes; else (AVX2) 16 of 8
SIDE = N_READ if WIDE else 2  # of those, the rows whose 32 lanes of sums fit the registers at once
TILE_T, UNROLL = 16, 4  # a batch's tiles: 16 tokens in the lanes of a vector; k steps per pass
TILE_N = 16 if WIDE else 6  # a tile's rows, each token's sums in one register (AVX2: two, and 3 more for x)


def _row_dot(qtype):
    """An intrinsic (ws, x, xsum, nb) -> N_READ floats: N_READ rows' dot products with x, over their nb blocks at
    addresses ws, side by side, SIDE at a time (several streams of weights per thread keep more reads in flight
    than one, as many as the registers hold); x and
    xsum (x summed over each group of 32, for the offsets) are float32 addresses. Per row, 32 lanes accumulate
    fma(scale, code * x, acc) over the row, a lane per group the offsets times xsum; each summed once at the end."""
    size, per = BLOCK_SIZES[qtype][1], GROUPS[qtype]
    vper = ir.VectorType(F32, per)

    @intrinsic
    def row_dot(typingctx, ws, x, xsum, nb):
        def codegen(context, builder, signature, args):
            ws, x, xsum, nb = args
            ahead = rows_ahead(builder, builder.mul(nb, ir.Constant(I64, size)), N_READ)
            fma = builder.module.declare_intrinsic("llvm.fma.v32f32", fnty=ir.FunctionType(V32F32, [V32F32] * 3))
            fma_per = builder.module.declare_intrinsic(f"llvm.fma.v{per}f32", fnty=ir.FunctionType(vper, [vper] * 3))

            def block(rows, i, sums):
                out = []
                for k, r in enumerate(rows):
                    w, acc, off = builder.extract_value(ws, r), *sums[2 * k:2 * k + 2]
                    blk = builder.add(w, builder.mul(i, ir.Constant(I64, size)))
                    prefetch_block(builder, blk, qtype, ahead)
                    items, offsets = groups(builder, qtype, blk)
                    first = builder.mul(i, ir.Constant(I64, per))  # the block's first group
                    for g, (codes, scale) in enumerate(items):
                        at = builder.add(first, ir.Constant(I64, g))
                        xv = load(builder, builder.add(x, builder.mul(at, ir.Constant(I64, 128))), V32F32)
                        acc = builder.call(fma, [scale, builder.fmul(codes, xv), acc])
                    if offsets is not None:
                        xs = load(builder, builder.add(xsum, builder.mul(first, ir.Constant(I64, 4))), vper)
                        off = builder.call(fma_per, [offsets, xs, off])
                    out += [acc, off]
                return out

            dots = []
            for first in range(0, N_READ, SIDE):  # SIDE rows a pass over the blocks
                sums = counted_loop(builder, nb, [ir.Constant(V32F32, None), ir.Constant(vper, None)] * SIDE,
                                    partial(block, range(first, first + SIDE)))
                dots += [builder.fadd(hsum(builder, sums[2 * r]), hsum(builder, sums[2 * r + 1]))  # no offsets: + 0
                         for r in range(SIDE)]
            return context.make_tuple(builder, signature.return_type, dots)

        return types.UniTuple(types.float32, N_READ)(types.UniTuple(types.int64, N_READ), *[types.int64] * 3), codegen

    return row_dot


def _row_values(qtype):
    """An intrinsic (w, out, nb): one row's nb blocks at address w dequantized into float32 at address out."""
    size, per = BLOCK_SIZES[qtype][1], GROUPS[qtype]

    @intrinsic
    def row_values(typingctx, w, out, nb):
        def codegen(context, builder, signature, args):
            w, out, nb = args

            def block(i, _):
                blk = builder.add(w, builder.mul(i, ir.Constant(I64, size)))
                items, offsets = groups(builder, qtype, blk)
                for g, (codes, scale) in enumerate(items):
                    v = builder.fmul(scale, codes)
                    if offsets is not None:
                        v = builder.fadd(v, broadcast_lane(builder, offsets, g, 32))
                    at = builder.add(builder.mul(i, ir.Constant(I64, per)), ir.Constant(I64, g))
                    to = builder.add(out, builder.mul(at, ir.Constant(I64, 128)))
                    builder.store(v, builder.inttoptr(to, V32F32.as_pointer()), align=4)
                return []

            counted_loop(builder, nb, [], block)
            return context.get_dummy_value()

        return types.none(*[types.int64] * 3), codegen

    return row_values


@njit(inline="always")
def part_of(starts, r):  # the part holding row r of a matrix held in parts: part p has rows starts[p] ..
    p = 0
    while r >= starts[p + 1]:
        p += 1
    return p


@njit(inline="always")
def row_address(bases, starts, r, row_bytes):  # row r of a matrix held in parts
    p = part_of(starts, r)
    return bases[p] + (r - starts[p]) * row_bytes


@njit(inline="always")
def row_quad(bases, starts, q, N, row_bytes):  # the addresses of rows 4q .. 4q + 3 (the last row again past N)
    """The N_READ rows one token's product reads side by side: several streams of weights per thread keep more
    reads in flight than one."""
    return (row_address(bases, starts, 4 * q, row_bytes), row_address(bases, starts, min(4 * q + 1, N - 1), row_bytes),
            row_address(bases, starts, min(4 * q + 2, N - 1), row_bytes),
            row_address(bases, starts, min(4 * q + 3, N - 1), row_bytes))


@njit(cache=True)
def to_lanes(a, n_tiles):  # [T, m] -> [n_tiles, m, TILE_T]: each tile's TILE_T tokens in the lanes, zeros past T
    T, m = a.shape
    out = np.zeros((n_tiles, m, TILE_T), a.dtype)
    for t in range(min(T, n_tiles * TILE_T)):
        out[t // TILE_T, :, t % TILE_T] = a[t]
    return out


@njit(inline="always")
def put_tile(out, res, t0, n0, rows, tokens):  # a tile's [rows, TILE_T] results into out [T, N] at (t0, n0)
    for i in range(rows):
        for k in range(tokens):
            out[t0 + k, n0 + i] = res[i, k]


CHUNKS = 64  # rows are split into this many chunks across threads
ROW_DOT = ROW_VALUES = BLOCK = SIZE = None  # one type's intrinsics and block sizes, in each copy's globals (KERNELS)


def _matvec(X, bases, starts):  # [P, K] f32, the parts' addresses and first rows -> [N] = W @ x
    """One token's product: every row times X[0] (P = 1), or each part's rows times its own row of X (P parts of
    whole quads: a token's experts, each with its own input)."""
    P, K = X.shape
    N = starts[-1]
    xsum = np.zeros((P, K // 32), np.float32)  # x summed over each group, for the offsets
    for p in range(P):
        for g in range(K // 32):
            for j in range(32):
                xsum[p, g] += X[p, g * 32 + j]
    out = np.empty(N, np.float32)
    n_quads = (N + N_READ - 1) // N_READ
    n_chunks = min(n_quads, CHUNKS)
    for c in prange(n_chunks):
        x0, xs0 = X.ctypes.data, xsum.ctypes.data  # taken in the loop: the arrays stay alive
        for q in range(c * n_quads // n_chunks, (c + 1) * n_quads // n_chunks):
            p = 0 if P == 1 else part_of(starts, N_READ * q)
            sums = ROW_DOT(row_quad(bases, starts, q, N, K // BLOCK * SIZE), x0 + p * K * 4, xs0 + p * (K // 32) * 4,
                           K // BLOCK)
            for i in range(N_READ):
                out[min(N_READ * q + i, N - 1)] = sums[i]
    return out


V16F32 = ir.VectorType(F32, 16)


@intrinsic
def lane_tile(typingctx, w, stride, K, xt, out):
    """(w, stride, K, xt, out): TILE_N dequantized rows (float32, K values each, `stride` bytes apart from w) against
    TILE_T tokens ([K, TILE_T] at xt, a token in each lane) -> out [TILE_N, TILE_T]: each weight broadcast to every
    lane, one FMA per weight and 16 tokens, a sum per row and token in its own register, added in k's order."""
    def codegen(context, builder, signature, args):
        w, stride, K, xt, out = args
        fma = builder.module.declare_intrinsic("llvm.fma.v16f32", fnty=ir.FunctionType(V16F32, [V16F32] * 3))

        rows = [builder.add(w, builder.mul(stride, ir.Constant(I64, r))) for r in range(TILE_N)]

        def step(i, accs):
            for u in range(UNROLL):
                k = builder.add(builder.mul(i, ir.Constant(I64, UNROLL)), ir.Constant(I64, u))
                x = load(builder, builder.add(xt, builder.mul(k, ir.Constant(I64, 64))), V16F32)
                accs = [builder.call(fma, [splat(builder, load(builder, builder.add(row, builder.mul(
                    k, ir.Constant(I64, 4))), F32), V16F32), x, acc]) for row, acc in zip(rows, accs, strict=True)]
            return accs

        accs = counted_loop(builder, builder.udiv(K, ir.Constant(I64, UNROLL)), [ir.Constant(V16F32, None)] * TILE_N,
                            step)
        for r, acc in enumerate(accs):
            builder.store(acc, builder.inttoptr(builder.add(out, ir.Constant(I64, 64 * r)), V16F32.as_pointer()),
                          align=4)
        return context.get_dummy_value()

    return types.none(*[types.int64] * 5), codegen


def _matmul(X, bases, starts):  # [T, K] f32, the parts' addresses and first rows -> [T, N] = X @ W.T
    """TILE_N rows at a time dequantized into a scratch, then multiplied by the tokens TILE_T at a time (lane_tile),
    the tokens' values transposed once so that each k's are one vector; past T, zeros (results dropped)."""
    T, K = X.shape
    N = starts[-1]
    n_tiles = (T + TILE_T - 1) // TILE_T
    xt = to_lanes(X, n_tiles)
    out = np.empty((T, N), np.float32)
    n_groups = (N + TILE_N - 1) // TILE_N
    n_chunks = min(n_groups, CHUNKS)
    for c in prange(n_chunks):
        # the rows dequantized, reused for every tile; a line apart more than K (rows a multiple of 4 KiB apart
        # would share the L1 cache's sets)
        w = np.empty((TILE_N, K + 16), np.float32)
        res = np.empty((TILE_N, TILE_T), np.float32)
        for g in range(c * n_groups // n_chunks, (c + 1) * n_groups // n_chunks):
            for i in range(TILE_N):
                r = min(TILE_N * g + i, N - 1)
                ROW_VALUES(row_address(bases, starts, r, K // BLOCK * SIZE), w[i:].ctypes.data, K // BLOCK)
            for j in range(n_tiles):
                lane_tile(w.ctypes.data, (K + 16) * 4, K, xt[j].ctypes.data, res.ctypes.data)
                put_tile(out, res, j * TILE_T, TILE_N * g, min(TILE_N, N - TILE_N * g), min(TILE_T, T - j * TILE_T))
    return out


def _rows(bases, starts, rows, out):  # rows [T] -> out [T, K] f32, dequantized
    K = out.shape[1]
    for i in prange(len(rows)):
        o = out[i:]  # taken in the loop: the array stays alive
        ROW_VALUES(row_address(bases, starts, rows[i], K // BLOCK * SIZE), o.ctypes.data, K // BLOCK)


def _kernels(qtype):
    consts = dict(ROW_DOT=_row_dot(qtype), ROW_VALUES=_row_values(qtype), BLOCK=BLOCK_SIZES[qtype][0],
                  SIZE=BLOCK_SIZES[qtype][1])
    return tuple(specialize(fn, f"{fn.__name__[1:]}_{qtype.name}", **consts) for fn in (_matvec, _matmul, _rows))


KERNELS = {}  # qtype -> (matvec, matmul, rows), made on first use


class Blocks(WeightMatrix):
    """A [N, K] weight held as its GGUF blocks, in place: `parts` are [rows, row bytes] arrays (memory maps of the
    file; a fused matrix's several), kept here so that the addresses the kernels take (`bases`, and `starts`, each
    part's first row) stay valid. `repacked` (numerics ggml): multiplied as llama.cpp's repacked x86 form."""

    repacked = False

    def __init__(self, parts, qtype, K):
        self.parts = [np.ascontiguousarray(p) for p in parts]
        self.qtype, self.shape = qtype, (sum(len(p) for p in self.parts), K)
        if any(p.shape[1] != byte_shape((1, K), qtype)[1] for p in self.parts):
            raise ValueError(f"{qtype.name} rows of {K} values take {byte_shape((1, K), qtype)[1]} bytes")
        self.bases = np.array([p.ctypes.data for p in self.parts], np.int64)
        self.starts = np.cumsum([0] + [len(p) for p in self.parts]).astype(np.int64)

    @property
    def nbytes(self):
        return sum(p.nbytes for p in self.parts)

    def join(self, ms):  # several matrices' rows as one (concat_blocks), or None: matrices.mul_mat_id's experts
        return concat_blocks(ms)

    def in_quads(self):  # whether every part's rows are whole quads: matmul_parts' condition
        return all(len(p) % N_READ == 0 for p in self.parts)

    def raw_rows(self, rows):  # [T] checked ids -> [T, row bytes]: those rows' blocks
        part = np.searchsorted(self.starts, rows, side="right") - 1
        if not len(rows):
            return np.empty((0, self.parts[0].shape[1]), np.uint8)
        return np.stack([self.parts[p][r - self.starts[p]] for p, r in zip(part, rows, strict=True)])


def concat_blocks(ms):
    """One matrix of the rows of several of one class, type, width and form, their blocks joined by reference; or
    None."""
    first = ms[0]  # (a decode step joins a token's experts several times a layer: a loop, not a generator)
    if not isinstance(first, Blocks):
        return None
    cls, qtype, K, repacked = type(first), first.qtype, first.shape[1], first.repacked
    for m in ms:
        if type(m) is not cls or m.qtype != qtype or m.shape[1] != K or m.repacked != repacked:
            return None
    whole = cls.__new__(cls)  # its class, type, form and kernels; the parts were checked when each was made
    whole.__dict__.update(first.__dict__)
    whole.parts = [p for m in ms for p in m.parts]
    whole.bases = np.concatenate([m.bases for m in ms])
    whole.starts = np.array([0, *itertools.accumulate(len(p) for p in whole.parts)], np.int64)
    whole.shape = (int(whole.starts[-1]), K)
    return whole


class QuantMatrix(Blocks):
    """A quantized [N, K] weight in its GGUF blocks: `x @ w.T` runs the kernels; `w[rows]` dequantizes rows."""

    def __init__(self, parts, qtype, K):
        super().__init__(parts, qtype, K)
        if qtype not in KERNELS:
            KERNELS[qtype] = _kernels(qtype)
        self.matvec, self.matmul_many, self.rows = KERNELS[qtype]

    def matmul(self, x):  # [T, K] -> [T, N]
        x = np.ascontiguousarray(x, dtype=np.float32)
        if len(x) > 1:
            return self.matmul_many(x, self.bases, self.starts)
        return self.matvec(x, self.bases, self.starts)[None]

    def matmul_parts(self, X):  # [P, K] -> [1, N]: part p's rows times X[p] (one token's experts)
        return self.matvec(np.ascontiguousarray(X, dtype=np.float32), self.bases, self.starts)[None]

    def __getitem__(self, rows):  # embedding lookup: [T] -> [T, K] float32
        rows = self.row_ids(rows)
        out = np.empty((len(rows), self.shape[1]), np.float32)
        self.rows(self.bases, self.starts, rows, out)
        return out


def _half_dot(bf16):
    """An intrinsic (ws, x, xsum, n) -> N_READ floats: the dot products of N_READ rows of n * 32 bfloat16 (bf16) or
    float16 weights at addresses ws with float32 x, side by side, in _row_dot's form (xsum unused): per row, 32
    float32 lanes accumulate fma(w, x, acc), one horizontal sum at the end."""
    v32i16, v32i32 = ir.VectorType(ir.IntType(16), 32), ir.VectorType(ir.IntType(32), 32)

    @intrinsic
    def half_dot(typingctx, ws, x, xsum, n):
        def codegen(context, builder, signature, args):
            ws, x, _, n = args
            rows = [builder.extract_value(ws, r) for r in range(N_READ)]
            ahead = rows_ahead(builder, builder.mul(n, ir.Constant(I64, 64)), N_READ)
            fma = builder.module.declare_intrinsic("llvm.fma.v32f32", fnty=ir.FunctionType(V32F32, [V32F32] * 3))

            def chunk(i, accs):
                xv = load(builder, builder.add(x, builder.mul(i, ir.Constant(I64, 128))), V32F32)
                out = []
                for w, acc in zip(rows, accs, strict=True):
                    at = builder.add(w, builder.mul(i, ir.Constant(I64, 64)))
                    prefetch(builder, builder.add(at, ahead))
                    bits = load(builder, at, v32i16)
                    if bf16:  # the top half of a float32
                        v = builder.bitcast(builder.shl(builder.zext(bits, v32i32), ir.Constant(v32i32, [16] * 32)),
                                            V32F32)
                    else:
                        v = builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), 32)), V32F32)
                    out.append(builder.call(fma, [v, xv, acc]))
                return out

            accs = counted_loop(builder, n, [ir.Constant(V32F32, None)] * N_READ, chunk)
            return context.make_tuple(builder, signature.return_type, [hsum(builder, acc) for acc in accs])

        return types.UniTuple(types.float32, N_READ)(types.UniTuple(types.int64, N_READ), *[types.int64] * 3), codegen

    return half_dot


MATVEC_HALF = {qtype: specialize(_matvec, f"matvec_{qtype.name.lower()}", ROW_DOT=_half_dot(qtype == QT.BF16),
                                 BLOCK=32, SIZE=64) for qtype in (QT.BF16, QT.F16)}  # a "block": 32 16-bit values


class HalfMatrix(FileMatrix):
    """An F16/BF16 matrix as stored in the file, memory-mapped: one token's product is a kernel reading its 16 bits
    per weight once (decode is bound by reading the weights; rows of whole 32s); a batch's converts it to float32 in
    the scratch and multiplies there (FileMatrix)."""

    def __init__(self, stored, scratch):
        super().__init__(stored, scratch)
        self.matvec = MATVEC_HALF[stored.qtype]
        self.bases = np.array([stored.raw.ctypes.data], np.int64)  # _matvec's parts: the one memory map
        self.starts = np.array([0, self.shape[0]], np.int64)

    def matmul(self, x):  # [T, K] -> [T, N]
        if len(x) > 1 or self.shape[1] % 32:
            return super().matmul(x)
        return self.matvec(np.ascontiguousarray(x, dtype=np.float32), self.bases, self.starts)[None]


class NumbaPlacement(FilePlacement):
    """Weights for the numba backend: matrices of the KERNEL_TYPES as QuantMatrix, in the file's blocks; the other
    matrices, in a model big enough (FilePlacement's size rule), in their file's form (F16/BF16 as HalfMatrix, the
    rest as FileMatrix), else float32 NumPy as the rest. `converted`: the quantized types without a kernel kept in
    the file, for a notice."""

    def __init__(self, in_file=None):
        super().__init__(in_file)
        self.converted = set()

    @property
    def keep(self):
        return FILE_FORMS if self.in_file else KERNEL_TYPES

    def prepare(self, qtypes, cfg):
        """Load the kernels of the file's quantized matrix types and of a step's small steps, before the weights
        are read; then release the pages that only loading them needed."""
        self.converted = {t.name for t in qtypes if t in self.keep - KERNEL_TYPES - {QT.F16, QT.BF16}}
        with compile_notice():
            warm_up(KERNEL_TYPES & set(qtypes))
            for qtype in (self.keep - KERNEL_TYPES) & set(qtypes) & {QT.F16, QT.BF16}:  # HalfMatrix's kernel
                half = QuantizedTensor(np.zeros((2, 256 * 2), np.uint8), qtype, (2, 256))
                _ = np.zeros((1, 256), np.float32) @ HalfMatrix(half, self.scratch).T
            warm_up_steps(numba_ops.OPS, cfg.head_dim)
        release_loader_pages()

    def __call__(self, a):
        if not isinstance(a, QuantizedTensor):
            return a
        if a.qtype in KERNEL_TYPES:
            return QuantMatrix([a.raw], a.qtype, a.shape[1])
        return (HalfMatrix if a.qtype in (QT.F16, QT.BF16) else FileMatrix)(a, self.scratch)

    def layer(self, lw):
        fuse_layer(lw, concat_blocks)
        map_experts(lw)


def warm_up(qtypes):
    """Run each kernel that matrices of these GGUF types use once, on a small zero matrix of each, so that Numba
    compiles it (or loads it from its cache) now rather than at the first token."""
    x = np.zeros((2, 256), np.float32)
    for qtype in qtypes:
        m = QuantMatrix([np.zeros(byte_shape((4, 256), qtype), np.uint8)], qtype, 256)
        _ = x[:1] @ m.T, x @ m.T, m[[0]]  # matvec, matmul, rows
