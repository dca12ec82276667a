"""numerics "ggml" on `--backend numba`: llama.cpp's integer dot products as Numba kernels.

The same arithmetic as numerics.ggml_numerics (which says what each step is and why), fast: activations quantized
to Q8_0/Q8_1/Q8_K in Numba, and the products written in LLVM IR, because Numba's loops over int8 come out as
widened 32-bit multiplies at half the speed of its float kernel. One token: per block of 32 weights the IR does
what ggml's x86 code does: unpack to 32 bytes, 8 int32 lanes of 4 byte products (`vpdpbusd` where the CPU has
AVX-512 VNNI, else the same sums written target-independently), fma(d_w * d_x, lane, acc) per lane, and at the
end ggml's horizontal sum. A batch: lane tiles, 16 tokens in the 16 lanes of a vector, each word of 4 weight codes
broadcast to every lane, so that one vpdpbusd serves 16 tokens and each token's float steps are its own lane's.
The weights stay in their GGUF bytes (d and m read as float16 in the kernel).
Q4_0, Q4_1, Q5_0, Q8_0 and the K-quants (Q2_K to Q6_K) have kernels here; Q5_1 uses refllama.numerics.ggml_numerics'
NumPy form.
"""

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ..formats.ggml_types import BLOCK_SIZES, QuantizedTensor, byte_shape
from ..formats.ggml_types import GGMLType as QT
from ..layers import Ops
from .block_ir import (
    bits32,
    broadcast_lane,
    const8,
    field_at,
    k_codes,
    k_crumbs,
    k_scales_mins,
    nibbles16,
    prefetch_block,
    q3_k_scales,
    q5_0_codes,
    q6_k_codes,
)
from .ggml_numerics import (
    GEMM_STEP,
    GgmlMatrix,
    GgmlPlacement,
    cos_sin,
    geglu,
    gelu,
    repacked,
    rope_cos_sin,
    silu,
    softcap,
)
from .ggml_numerics import softmax as router_softmax
from .ggml_tables import LAYOUT
from .ir import F32, I8, I32, I64, V32I8, counted_loop, hsum, lanes, load, load_f16, specialize, splat
from .kernel_pages import compile_notice, release_loader_pages, warm_up_steps
from .matrices import fuse_layer
from .numba_ops import ROPE, V64F32, _kq_dot, expf, kq_dot16, rms_norm
from .quant import LANES, N_READ, Blocks, concat_blocks, put_tile, row_address, row_quad, to_lanes


def host_has_vnni():
    """Whether this CPU has 256-bit AVX-512 VNNI (vpdpbusd on ymm registers): compiling that instruction for a CPU
    without it aborts the process, so the kernels' form is chosen from LLVM's view of the host."""
    features = llvm.get_host_cpu_features()
    return bool(features.get("avx512vnni") and features.get("avx512vl"))


VNNI = host_has_vnni()
BLOCK_BYTES = {t: BLOCK_SIZES[t][1] for t in (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q8_0)}  # the types with IR kernels
V8I32, V8F32 = ir.VectorType(I32, 8), ir.VectorType(F32, 8)
V16I32, V16F32 = ir.VectorType(I32, 16), ir.VectorType(F32, 16)
MAGIC = 0x4B400000  # 1.5 * 2^23 as float32 bits: adding an int n (|n| < 2^22) to them gives the bits of 1.5 * 2^23 + n


def _lanes(builder, u, y, vnni):  # <32 x i8> unsigned, <32 x i8> signed -> <8 x i32>: lane j = sum of 4 products
    if vnni:
        fn = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.256", fnty=ir.FunctionType(
            V8I32, [V8I32, V8I32, V8I32]))
        return builder.call(fn, [ir.Constant(V8I32, None), builder.bitcast(u, V8I32), builder.bitcast(y, V8I32)])
    v32 = ir.VectorType(I32, 32)
    p = builder.mul(builder.zext(u, v32), builder.sext(y, v32))
    parts = [builder.shuffle_vector(p, ir.Constant(v32, ir.Undefined), ir.Constant(ir.VectorType(I32, 8),
                                                                                  list(range(k, 32, 4))))
             for k in range(4)]
    return builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3]))


def _dpbusd16(builder, acc, u, y, vnni):  # <16 x i32> + 4 unsigned bytes of u times 4 signed of y, lane by lane
    if vnni:
        fn = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.512", fnty=ir.FunctionType(
            V16I32, [V16I32] * 3))
        return builder.call(fn, [acc, u, y])
    v64, v64i8 = ir.VectorType(I32, 64), ir.VectorType(I8, 64)
    p = builder.mul(builder.zext(builder.bitcast(u, v64i8), v64), builder.sext(builder.bitcast(y, v64i8), v64))
    parts = [builder.shuffle_vector(p, p, ir.Constant(V16I32, list(range(k, 64, 4)))) for k in range(4)]
    return builder.add(acc, builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3])))


def _make_dot(qtype, vnni, repacked):
    """An intrinsic (ws, x, xd, xs, nb) -> N_READ floats: one token's dot products with the rows at addresses ws,
    nb blocks each, read side by side; x: the token's Q8 codes, xd, xs: its d and s (float32) per block. Per
    block ggml_vec_dot's 8 int32 lanes, fma(d_w * d_x, lane, acc) into 8 float32 lanes, hsum_float_8 at the end
    (Q4_1: plus the m_w * s_x sums); `repacked` (Q4_0): x86's repacked gemv, one fma(isum, d_w * d_x, acc) a
    block."""
    fma8_type, fma1_type = ir.FunctionType(V8F32, [V8F32] * 3), ir.FunctionType(F32, [F32] * 3)

    def codegen(context, builder, signature, args):
        ws, x, xd, xs, nb = args
        fma8 = builder.module.declare_intrinsic("llvm.fma.v8f32", fnty=fma8_type)
        fma1 = builder.module.declare_intrinsic("llvm.fma.f32", fnty=fma1_type)
        reduce8 = builder.module.declare_intrinsic("llvm.vector.reduce.add.v8i32", fnty=ir.FunctionType(I32, [V8I32]))
        zero = ir.Constant(V32I8, None)

        def row_block(w, i, acc, summs):  # one row's block i added to its sums and its Q4_1 offset sums
            blk = builder.add(w, builder.mul(i, ir.Constant(I64, BLOCK_BYTES[qtype])))
            prefetch_block(builder, blk, qtype)
            y = load(builder, builder.add(x, builder.mul(i, ir.Constant(I64, 32))), V32I8)
            if qtype in (QT.Q8_0, QT.Q5_0):  # ggml's sign trick: |w| (unsigned) times y with w's sign
                q = load(builder, field_at(builder, blk, qtype, "qs"), V32I8) if qtype == QT.Q8_0 else \
                    q5_0_codes(builder, blk)
                neg = builder.icmp_signed("<", q, zero)
                u = builder.select(neg, builder.sub(zero, q), q)
                is_zero = builder.icmp_signed("==", q, zero)
                y = builder.select(neg, builder.sub(zero, y), builder.select(is_zero, zero, y))
            else:  # 4-bit codes: byte j holds value j (low nibble) and value j + 16 (high)
                u = nibbles16(builder, field_at(builder, blk, qtype, "qs"))
            at = builder.mul(i, ir.Constant(I64, 4))
            d = builder.fmul(load_f16(builder, field_at(builder, blk, qtype, "d")), load(builder, builder.add(xd, at),
                                                                                         F32))  # d_w * d_x
            if qtype == QT.Q4_1:
                summs = builder.call(fma1, [load_f16(builder, field_at(builder, blk, qtype, "m")),
                                            load(builder, builder.add(xs, at), F32), summs])
            dots = _lanes(builder, u, y, vnni)
            if qtype == QT.Q4_0:  # (code - 8) * y = code * y - 8 * y, lane by lane
                dots = builder.sub(dots, _lanes(builder, ir.Constant(V32I8, [8] * 32), y, vnni))
            if repacked:
                return builder.call(fma1, [builder.sitofp(builder.call(reduce8, [dots]), F32), d, acc]), summs
            return builder.call(fma8, [splat(builder, d, V8F32), builder.sitofp(dots, V8F32), acc]), summs

        def block(i, sums):  # every row's block i: sums holds each row's sum and then its offset sum
            return [v for r in range(N_READ)
                    for v in row_block(builder.extract_value(ws, r), i, sums[2 * r], sums[2 * r + 1])]

        acc0 = ir.Constant(F32 if repacked else V8F32, None)
        sums = counted_loop(builder, nb, [acc0, ir.Constant(F32, 0.0)] * N_READ, block)
        results = []
        for r in range(N_READ):
            acc, summs = sums[2 * r], sums[2 * r + 1]
            if repacked:
                results.append(acc)
                continue
            r4 = builder.fadd(lanes(builder, acc, 4, 4), lanes(builder, acc, 0, 4))
            lane = [builder.extract_element(r4, ir.Constant(I32, j)) for j in range(4)]  # hsum_float_8's order
            total = builder.fadd(builder.fadd(lane[0], lane[2]), builder.fadd(lane[1], lane[3]))
            results.append(builder.fadd(total, summs))
        return context.make_tuple(builder, signature.return_type, results)

    @intrinsic
    def row_dot(typingctx, ws, x, xd, xs, nb):
        return types.UniTuple(types.float32, N_READ)(types.UniTuple(types.int64, N_READ),
                                                        *[types.int64] * 4), codegen

    return row_dot


@njit(cache=True)
def _round_f16(x):  # float32 -> float32 holding the nearest float16 (ties to even), as F16C's conversion
    """Veltkamp's split keeps 11 significant bits of a float32 (8193 = 2^13 + 1); below float16's normal range the
    spacing is fixed at 2^-24; from 65520 on, infinity."""
    a = abs(x)
    if a >= np.float32(65520.0):  # rounds to infinity
        r = np.float32(np.inf)
    elif a < np.float32(2.0 ** -14):
        r = np.float32(np.rint(a * np.float32(2.0 ** 24)) * np.float32(2.0 ** -24))
    else:
        t = a * np.float32(8193.0)
        r = t - (t - a)
    return -r if x < 0 else r


@njit(cache=True)
def _round_f16s(x):  # [T, H, HD] f32 -> its values rounded to float16
    out = np.empty_like(x)
    for t in range(x.shape[0]):
        for h in range(x.shape[1]):
            for d in range(x.shape[2]):
                out[t, h, d] = _round_f16(x[t, h, d])
    return out


@njit(cache=True)
def quantize_q8(X, xq, xd, xs):  # [T, K] f32 -> xq [T, K] i8, xd, xs [K/32, T] f32: Q8_1 (Q8_0: xs unused)
    T, K = X.shape
    for t in range(T):
        for b in range(K // 32):
            amax = np.float32(0.0)
            for j in range(32):
                amax = max(amax, abs(X[t, b * 32 + j]))
            d = amax / np.float32(127.0)
            inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
            total = 0
            for j in range(32):
                q = np.int32(np.rint(X[t, b * 32 + j] * inv))
                xq[t, b * 32 + j] = q
                total += q
            xd[b, t] = _round_f16(d)
            xs[b, t] = _round_f16(d * np.float32(total))


TILE_ROWS = {False: 2, True: 4}  # rows a block tile multiplies at once: 8 float32 sums a row (4 if repacked: one)


def _signed_codes(builder, blk, qtype):  # a Q4_0/Q4_1/Q5_0/Q8_0 block -> <32 x i8>: the integers ggml multiplies
    if qtype == QT.Q8_0:
        return load(builder, field_at(builder, blk, qtype, "qs"), V32I8)
    if qtype == QT.Q5_0:
        return q5_0_codes(builder, blk)
    codes = nibbles16(builder, field_at(builder, blk, qtype, "qs"))
    return builder.sub(codes, const8(8)) if qtype == QT.Q4_0 else codes


def _make_block_codes(qtype):
    """An intrinsic (w, nb, out, bias): a row's nb blocks of 32 at address w unpacked for the block tiles: at out,
    its signed codes (K bytes), then per word of 4 codes bias - 128 * their sum (K/4 int32): x enters the tiles'
    vpdpbusd as x + 128 (unsigned), so each word's products start from this."""
    def codegen(context, builder, signature, args):
        w, nb, out, bias = args
        K = builder.mul(nb, ir.Constant(I64, 32))

        def block(i, _):
            codes = _signed_codes(builder, builder.add(w, builder.mul(i, ir.Constant(I64, BLOCK_BYTES[qtype]))), qtype)
            at = builder.mul(i, ir.Constant(I64, 32))
            builder.store(codes, builder.inttoptr(builder.add(out, at), V32I8.as_pointer()), align=1)
            sums = _lanes(builder, const8(1), codes, False)  # each word's sum
            first = builder.sub(splat(builder, builder.trunc(bias, I32), V8I32), builder.shl(sums, ir.Constant(
                V8I32, [7] * 8)))
            builder.store(first, builder.inttoptr(builder.add(out, builder.add(K, at)), V8I32.as_pointer()), align=1)
            return []

        counted_loop(builder, nb, [], block)
        return context.get_dummy_value()

    @intrinsic
    def block_codes(typingctx, w, nb, out, bias):
        return types.none(*[types.int64] * 4), codegen

    return block_codes


def _make_block_tile(qtype, vnni, repacked):
    """An intrinsic (ws, codes, pitch, xt, dt, st, nb, out): TILE_ROWS[repacked] rows, their blocks of 32 at
    addresses ws (for d and m) unpacked by _make_block_codes at codes, codes + pitch, .., against LANES tokens in
    the lanes of a vector, as _make_dot computes each token's: xt, the tokens' Q8 codes plus 128, 4 at a time
    ([K/4, LANES] words); dt, st: their Q8 d and s ([K/32, LANES] float32); out: [rows, LANES] float32. Each word
    of a row's codes is broadcast from memory to every lane, and one vpdpbusd adds its 4 products with every
    token's: ggml's 8 int32 lanes of a block (lane j: elements 4j .. 4j + 3) are 8 vectors here, each with its own
    float32 sums (vec_dot's 8 lanes, hsum_float_8 at the end; `repacked`: one sum a block). Not repacked, each sum
    starts from MAGIC, so that its float32 value is its bits minus 1.5 * 2^23."""
    size, n_rows = BLOCK_BYTES[qtype], TILE_ROWS[repacked]
    per = 1 if repacked else 8  # float32 sums per row

    def codegen(context, builder, signature, args):
        ws, codes, pitch, xt, dt, st, nb, out = args
        rows = [builder.extract_value(ws, r) for r in range(n_rows)]
        K = builder.mul(nb, ir.Constant(I64, 32))
        fma = builder.module.declare_intrinsic("llvm.fma.v16f32", fnty=ir.FunctionType(V16F32, [V16F32] * 3))
        magic = ir.Constant(V16F32, [1.5 * 2 ** 23] * 16)

        def vec(addr, at, ty=V16I32):  # the vector at addr + 64 * at
            return load(builder, builder.add(addr, builder.mul(at, ir.Constant(I64, 64))), ty)

        def word(r, at, plus):  # row r's word `at` of its codes (plus = 0) or of its starts (plus = K)
            addr = builder.add(builder.add(codes, builder.mul(ir.Constant(I64, r), pitch)), plus)
            return splat(builder, load(builder, builder.add(addr, builder.mul(at, ir.Constant(I64, 4))), I32), V16I32)

        def block(i, accs):
            accs, dx = list(accs), vec(dt, i, V16F32)
            ds, isums = [], [ir.Constant(V16I32, None)] * n_rows
            for r, w in enumerate(rows):
                blk = builder.add(w, builder.mul(i, ir.Constant(I64, size)))
                ds.append(builder.fmul(splat(builder, load_f16(builder, field_at(builder, blk, qtype, "d")), V16F32),
                                       dx))  # d_w * d_x
                if qtype == QT.Q4_1:  # m_w * s_x, summed apart
                    m = splat(builder, load_f16(builder, field_at(builder, blk, qtype, "m")), V16F32)
                    accs[r * (per + 1) + per] = builder.call(fma, [m, vec(st, i, V16F32), accs[r * (per + 1) + per]])
            for j in range(8):
                at = builder.add(builder.mul(i, ir.Constant(I64, 8)), ir.Constant(I64, j))
                y = vec(xt, at)
                for r in range(n_rows):
                    lanes = _dpbusd16(builder, word(r, at, K), y, word(r, at, ir.Constant(I64, 0)), vnni)
                    if repacked:
                        isums[r] = builder.add(isums[r], lanes)
                    else:
                        k = r * (per + 1) + j
                        value = builder.fsub(builder.bitcast(lanes, V16F32), magic)
                        accs[k] = builder.call(fma, [ds[r], value, accs[k]])
            if repacked:  # one fma(isum, d_w * d_x, acc) a block
                for r in range(n_rows):
                    k = r * (per + 1)
                    accs[k] = builder.call(fma, [builder.sitofp(isums[r], V16F32), ds[r], accs[k]])
            return accs

        accs = counted_loop(builder, nb, [ir.Constant(V16F32, None)] * (n_rows * (per + 1)), block)
        for r in range(n_rows):
            *lanes, summs = accs[r * (per + 1):(r + 1) * (per + 1)]
            if repacked:
                total = lanes[0]
            else:  # hsum_float_8: (lanes 4-7 + lanes 0-3), then (0 + 2) + (1 + 3); then Q4_1's m * s sums
                half = [builder.fadd(lanes[4 + j], lanes[j]) for j in range(4)]
                total = builder.fadd(builder.fadd(builder.fadd(half[0], half[2]), builder.fadd(half[1], half[3])),
                                     summs)
            at = builder.inttoptr(builder.add(out, ir.Constant(I64, 64 * r)), V16F32.as_pointer())
            builder.store(total, at, align=4)
        return context.get_dummy_value()

    @intrinsic
    def block_tile(typingctx, ws, codes, pitch, xt, dt, st, nb, out):
        return types.none(types.UniTuple(types.int64, n_rows), *[types.int64] * 7), codegen

    return block_tile


# one type's intrinsics (a token's N_READ rows; a row's codes unpacked; a block tile), sizes, the starts' MAGIC
DOTS = CODES = BTILE = ROW_BYTES = N_ROWS = BIAS = None


def _matmul(X, bases, starts):  # [T, K] f32, the parts' addresses and first rows -> [T, N] f32
    T, K = X.shape
    N, nb = starts[-1], K // 32
    xq = np.empty((T, K), np.int8)
    xd = np.empty((nb, T), np.float32)  # block by block, the tokens side by side
    xs = np.empty((nb, T), np.float32)
    quantize_q8(X, xq, xd, xs)
    out = np.empty((T, N), np.float32)
    if T == 1:
        n_quads = (N + N_READ - 1) // N_READ
        n_chunks = min(n_quads, 64)
        for c in prange(n_chunks):
            # addresses taken here, inside the loop: the arrays are then the loop's own arguments, kept alive by it
            # (taken before it, Numba may free xq once its last named use has passed)
            x0, d0, s0 = xq.ctypes.data, xd.ctypes.data, xs.ctypes.data
            for q in range(c * n_quads // n_chunks, (c + 1) * n_quads // n_chunks):
                sums = DOTS(row_quad(bases, starts, q, N, nb * ROW_BYTES), x0, d0, s0, nb)
                for i in range(N_READ):
                    out[0, min(N_READ * q + i, N - 1)] = sums[i]
        return out
    n_tiles = (T + LANES - 1) // LANES
    # the tokens in lanes: x's codes plus 128 (each byte's sign bit flipped: 0x80808080), their d and s
    xt, dt, st = to_lanes(xq.view(np.int32) ^ np.int32(-0x7F7F7F80), n_tiles), to_lanes(xd.T, n_tiles), \
        to_lanes(xs.T, n_tiles)
    n_groups = (N + N_ROWS - 1) // N_ROWS
    n_chunks = min(n_groups, 64)
    pitch = 2 * K + 64  # a row's codes and starts, then a line more (rows 4 KiB apart would share cache sets)
    for c in prange(n_chunks):
        res = np.empty((N_ROWS, LANES), np.float32)
        scratch = np.empty(N_ROWS * pitch, np.uint8)
        w = np.zeros(8, np.int64)
        for g in range(c * n_groups // n_chunks, (c + 1) * n_groups // n_chunks):
            n0, rows = g * N_ROWS, min(N_ROWS, N - g * N_ROWS)
            for i in range(N_ROWS):
                w[i] = row_address(bases, starts, n0 + min(i, rows - 1), nb * ROW_BYTES)
                CODES(w[i], nb, scratch.ctypes.data + i * pitch, BIAS)
            ws = (w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7])[:N_ROWS]
            for j in range(n_tiles):
                BTILE(ws, scratch.ctypes.data, pitch, xt[j].ctypes.data, dt[j].ctypes.data, st[j].ctypes.data, nb,
                      res.ctypes.data)
                put_tile(out, res, j * LANES, n0, rows, min(LANES, T - j * LANES))
    return out


def _make_matmul(qtype, vnni, repacked):
    """_matmul with one type's and form's intrinsics as its globals."""
    name = f"matmul_{qtype.name}{'_repacked' if repacked else ''}_{'vnni' if vnni else 'generic'}"
    return specialize(_matmul, name, DOTS=_make_dot(qtype, vnni, repacked), CODES=_make_block_codes(qtype),
                      BTILE=_make_block_tile(qtype, vnni, repacked), ROW_BYTES=BLOCK_BYTES[qtype],
                      N_ROWS=TILE_ROWS[repacked], BIAS=0 if repacked else MAGIC)


KERNELS = {}  # (qtype, vnni, repacked) -> compiled matmul (a K-quant's _kquant_matmul), made on first use


def kernel(qtype, vnni=VNNI, repacked=False):
    if (qtype, vnni, repacked) not in KERNELS:
        KERNELS[qtype, vnni, repacked] = _make_matmul(qtype, vnni, repacked)
    return KERNELS[qtype, vnni, repacked]


class GgmlBlocks(Blocks):
    """A matrix in its GGUF blocks, in place, for numerics ggml: rows dequantize as GgmlMatrix's (llama.cpp's
    get_rows); `vnni` picks the kernels' form."""

    vnni = VNNI

    def __getitem__(self, rows):
        rows = self.row_ids(rows)
        return GgmlMatrix(self.raw_rows(rows), self.qtype, (len(rows), self.shape[1]))[np.arange(len(rows))]


class NumbaGgmlMatrix(GgmlBlocks):
    """A Q4_0/Q4_1/Q5_0/Q8_0 matrix: `x @ w.T` runs the IR kernel."""

    def matmul(self, x):  # [T, K] -> [T, N]
        return kernel(self.qtype, self.vnni, self.repacked)(np.ascontiguousarray(x, dtype=np.float32), self.bases,
                                                            self.starts)


class GgmlNumbaPlacement(GgmlPlacement):
    """numerics "ggml" on numba: Q4_0, Q4_1, Q5_0 and Q8_0 matrices as NumbaGgmlMatrix, the K-quants as
    NumbaKQuantMatrix, Q5_1 as GgmlMatrix."""

    def prepare(self, qtypes, cfg):
        """Load the kernels of the file's matrix types, of a step's small steps and of the cache's RoPE angles
        (sincosf) before the weights are read; then release the pages that only loading them needed."""
        super().prepare(qtypes, cfg)
        x = np.zeros((2, 256), np.float32)
        with compile_notice():
            for qtype in set(qtypes) & {*BLOCK_BYTES, *K_QUANTS}:  # each matrix class this placement makes,
                for rows in (1, 8):  # in both forms where a type is repacked (8 rows)
                    w = QuantizedTensor(np.zeros(byte_shape((rows, 256), qtype), np.uint8), qtype, (rows, 256))
                    _ = x @ self(w).T
            warm_up_steps(OPS, cfg.head_dim)
            cos_sin(x)
        release_loader_pages()

    def __call__(self, a):
        if isinstance(a, QuantizedTensor) and a.qtype in {*BLOCK_BYTES, *K_QUANTS}:
            m = (NumbaGgmlMatrix if a.qtype in BLOCK_BYTES else NumbaKQuantMatrix)([a.raw], a.qtype, a.shape[1])
            m.repacked = self.repack and repacked(a.qtype, a.shape)
            return m
        return super().__call__(a)

    def layer(self, lw):
        fuse_layer(lw, concat_blocks)


K_QUANTS = (QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K)


def _kblock_sums(builder, blk, qtype, vnni, x, bs):
    """IR of one K-quant block of 256 weights at blk against a token's Q8_K block: its int8 codes at x and their
    int32 sums of 16 at bs. -> (d, dmin, lanes, mins, mins8), exact int32 sums of the codes' products times their
    sub-block scales: `lanes` <8 x i32>, element e of the block in lane (e % 32) // 4 (ggml_vec_dot's lanes; Q6_K's
    codes 0..63, each lane l taking back 32 * scale * x's sums of the sub-blocks 2l and 2l + 1; Q3_K's codes the
    two low bits minus 4 where the high bit is clear, two products a lane as ggml's), `mins` <4 x i32> the mins
    times x's sums, by 64 elements (Q4_K/Q5_K/Q2_K; zero for Q6_K and Q3_K) and `mins8` Q2_K's by 32 (its
    vec_dot's 8 lanes; None for the others)."""
    v4, v8, v16 = ir.VectorType(I32, 4), V8I32, ir.VectorType(I32, 16)
    prefetch_block(builder, blk, qtype)
    d = load_f16(builder, field_at(builder, blk, qtype, "d"))
    dmin, mins = ir.Constant(F32, 0.0), None
    # Q2_K, Q3_K, Q6_K: 16 sub-blocks of 16, so chunk c of 32 has lanes 0-3 in sub-block 2c, lanes 4-7 in 2c + 1
    by_16 = qtype in (QT.Q2_K, QT.Q3_K, QT.Q6_K)
    if qtype == QT.Q6_K:
        codes = [q6_k_codes(builder, blk, c) for c in range(8)]
        sc16 = builder.sext(load(builder, field_at(builder, blk, qtype, "scales"), ir.VectorType(I8, 16)), v16)
    elif qtype == QT.Q3_K:  # low bits, and 4 where the high bit is clear: the code is low - that
        codes = [(k_crumbs(builder, blk, qtype, c), builder.shl(builder.xor(bits32(builder, field_at(
            builder, blk, qtype, "hmask"), c, 1), const8(1)), const8(2))) for c in range(8)]
        sc16 = builder.sext(q3_k_scales(builder, blk), v16)
    elif qtype == QT.Q2_K:  # each scales byte: the sub-block's scale (low 4 bits) and min (high 4)
        codes = [k_crumbs(builder, blk, qtype, c) for c in range(8)]
        packed = builder.zext(load(builder, field_at(builder, blk, qtype, "scales"), ir.VectorType(I8, 16)), v16)
        sc16, mins = builder.and_(packed, ir.Constant(v16, [15] * 16)), builder.lshr(packed, ir.Constant(v16, [4] * 16))
        dmin = load_f16(builder, field_at(builder, blk, qtype, "dmin"))
    else:
        codes = [k_codes(builder, blk, qtype, j) for j in range(8)]
        both = k_scales_mins(builder, blk, qtype)  # scales in lanes 0-7, mins in 8-15
        scales = [broadcast_lane(builder, both, j, 8) for j in range(8)]
        mins = builder.shuffle_vector(both, both, ir.Constant(v8, list(range(8, 16))))
        dmin = load_f16(builder, field_at(builder, blk, qtype, "dmin"))
    if by_16:
        scales = [builder.shuffle_vector(sc16, sc16, ir.Constant(v8, [2 * c] * 4 + [2 * c + 1] * 4)) for c in range(8)]
    evens, odds = (ir.Constant(v8, list(range(o, 16, 2))) for o in (0, 1))

    def halves(v):  # <8 x i32> -> <4 x i32>: lanes 2k + 2k + 1
        return builder.add(builder.shuffle_vector(v, v, ir.Constant(v4, [0, 2, 4, 6])),
                           builder.shuffle_vector(v, v, ir.Constant(v4, [1, 3, 5, 7])))

    def chunk(c):  # chunk c's 8 lanes of code products, times their scales
        y = load(builder, builder.add(x, ir.Constant(I64, 32 * c)), V32I8)
        if qtype == QT.Q3_K:
            dots = builder.sub(_lanes(builder, codes[c][0], y, vnni), _lanes(builder, codes[c][1], y, vnni))
        else:
            dots = _lanes(builder, codes[c], y, vnni)
        return builder.mul(dots, scales[c])

    by_pair = [builder.add(chunk(2 * p), chunk(2 * p + 1)) for p in range(4)]  # chunks of 32: 2p and 2p + 1
    lanes = builder.add(builder.add(by_pair[0], by_pair[1]), builder.add(by_pair[2], by_pair[3]))
    sums = load(builder, bs, v16)  # x's 16 sums of 16
    m4, m8 = ir.Constant(v4, None), None
    if qtype == QT.Q6_K:
        taken = builder.mul(sums, sc16)  # [16]: 32 times these are taken back, by lane pairs
        taken = builder.add(builder.shuffle_vector(taken, taken, evens), builder.shuffle_vector(taken, taken, odds))
        lanes = builder.sub(lanes, builder.mul(taken, ir.Constant(v8, [32] * 8)))
    elif qtype == QT.Q2_K:
        prod = builder.mul(sums, mins)  # [16]: each sub-block's min times x's sum over it
        m8 = builder.add(builder.shuffle_vector(prod, prod, evens), builder.shuffle_vector(prod, prod, odds))
        m4 = halves(m8)
    elif qtype != QT.Q3_K:
        by_32 = builder.add(builder.shuffle_vector(sums, sums, evens), builder.shuffle_vector(sums, sums, odds))
        m4 = halves(builder.mul(by_32, mins))  # [8]: each sub-block's min times x's sum over it, by 64
    return d, dmin, lanes, m4, m8


# per K-quant: (values per sub-block, the largest |code - offset|, the largest |scale|), and the offsets
UNIT_BOUNDS = {QT.Q2_K: (16, 3, 15), QT.Q3_K: (16, 4, 32), QT.Q4_K: (32, 15, 63), QT.Q5_K: (32, 31, 63),
               QT.Q6_K: (16, 32, 128)}
UNIT_SHIFT = {QT.Q3_K: 4, QT.Q6_K: 32}
ROWS = 4  # rows of weights a K-quant tile multiplies at once


def _kunits(builder, blk, qtype):
    """A K-quant block's sub-blocks as a lane tile multiplies them: (d, dmin, codes, scales, mins): codes(u) emits
    sub-block u's codes as unsigned bytes (<n x i8>, n = UNIT_BOUNDS' values per sub-block; the value is the code
    minus UNIT_SHIFT) where it is called; lane u of scales and mins (vectors of i32; mins None for the types
    without) is its integer scale and min."""
    d, dmin = load_f16(builder, field_at(builder, blk, qtype, "d")), ir.Constant(F32, 0.0)
    if "dmin" in LAYOUT[qtype]:
        dmin = load_f16(builder, field_at(builder, blk, qtype, "dmin"))

    if qtype in (QT.Q4_K, QT.Q5_K):
        both = k_scales_mins(builder, blk, qtype)  # scales in lanes 0-7, mins in 8-15
        return d, dmin, lambda u: k_codes(builder, blk, qtype, u), *(lanes(builder, both, h, 8) for h in (0, 8))
    v16i8 = ir.VectorType(I8, 16)
    mins = None
    if qtype == QT.Q6_K:
        def chunk(c):
            return q6_k_codes(builder, blk, c)

        scales = builder.sext(load(builder, field_at(builder, blk, qtype, "scales"), v16i8), V16I32)
    elif qtype == QT.Q3_K:  # the two low bits and the high bit: code = low + 4 high - 4
        def chunk(c):
            high = bits32(builder, field_at(builder, blk, qtype, "hmask"), c, 1)
            return builder.or_(k_crumbs(builder, blk, qtype, c), builder.shl(high, const8(2)))

        scales = builder.sext(q3_k_scales(builder, blk), V16I32)
    else:  # Q2_K: each scales byte holds the sub-block's scale (low 4 bits) and min (high 4)
        def chunk(c):
            return k_crumbs(builder, blk, qtype, c)

        packed = builder.zext(load(builder, field_at(builder, blk, qtype, "scales"), v16i8), V16I32)
        scales = builder.and_(packed, ir.Constant(V16I32, [15] * 16))
        mins = builder.lshr(packed, ir.Constant(V16I32, [4] * 16))

    def codes(u):  # the half of a chunk of 32
        c = chunk(u // 2)
        return builder.shuffle_vector(c, c, ir.Constant(V16I32, list(range(16 * (u % 2), 16 * (u % 2) + 16))))

    return d, dmin, codes, scales, mins


def _make_lane_tile(qtype, vnni, repacked):
    """An intrinsic (ws, xt, bt, bf, dt, nb, out): the ROWS rows at addresses ws, nb blocks each, against LANES
    tokens, the tokens in the lanes of a vector. xt: the tokens' Q8_K codes, 4 at a time ([K/4, LANES] words); bt,
    bf: their sums of 16 ([K/16, LANES], int32 and float32); dt: their scales ([nb, LANES] float32); out: the
    [ROWS, LANES] float32 results. Each weight's 4 codes are broadcast to every lane and one vpdpbusd adds their
    products with all the tokens' (the codes unsigned, x signed: a code's offset is taken back from x's sums), so
    no sum is ever reduced across lanes; each vector of x is read once for the ROWS rows. Each token's float steps
    are its own lane's: the repacked gemm's (fma(isum, d_w * d_x, acc) and fma(msum, dmin_w * d_x, accm) every
    GEMM_STEP sub-blocks of 32, then acc - accm) or the tiled kernel's (per block r = isum * d_w, r = fma(-dmin_w,
    msum, r), acc = fma(r, d_x, acc)). A step's integer sums times their scales are added in float32 where every
    partial sum stays below 2^24 (exact: an FMA instead of a 32-bit multiply; each vpdpbusd sum then starts from
    MAGIC, so that its float32 value is its bits minus 1.5 * 2^23, a subtraction either FMA unit takes instead of
    a conversion only one does), else in int32; msum always is."""
    size = BLOCK_SIZES[qtype][1]
    step = 32 * GEMM_STEP.get(qtype, 8) if repacked else 256  # values per float step
    n, top, scale_top = UNIT_BOUNDS[qtype]
    in_float = step // n * n * top * 127 * scale_top < 2 ** 24  # a step's scaled sums exact in float32

    def codegen(context, builder, signature, args):
        ws, xt, bt, bf, dt, nb, out = args
        rows = [builder.extract_value(ws, r) for r in range(ROWS)]
        fma = builder.module.declare_intrinsic("llvm.fma.v16f32", fnty=ir.FunctionType(V16F32, [V16F32] * 3))
        zero, fzero = ir.Constant(V16I32, None), ir.Constant(V16F32, None)
        magic = ir.Constant(V16F32, [1.5 * 2 ** 23] * 16)

        def vec(addr, at, ty=V16I32):  # the vector at addr + 64 * at
            return load(builder, builder.add(addr, builder.mul(at, ir.Constant(I64, 64))), ty)

        def fsplat(v):
            return splat(builder, v, V16F32)

        def lane(v, u):
            return builder.extract_element(v, ir.Constant(I32, u))

        def block(i, accs):
            dx = vec(dt, i, V16F32)
            at = [builder.add(builder.mul(i, ir.Constant(I64, 16)), ir.Constant(I64, s)) for s in range(16)]
            bs, bsf = [vec(bt, a) for a in at], [vec(bf, a, V16F32) for a in at]
            blocks = []
            for w in rows:
                blk = builder.add(w, builder.mul(i, ir.Constant(I64, size)))
                prefetch_block(builder, blk, qtype)
                d, dmin, codes, scales, mins = _kunits(builder, blk, qtype)
                if in_float:  # converted once a block
                    scales = builder.sitofp(scales, ir.VectorType(F32, scales.type.count))
                if mins is not None:
                    mins = builder.sitofp(mins, ir.VectorType(F32, mins.type.count))
                blocks.append((d, dmin, codes, scales, mins))
            accs = list(accs)
            isums, msums = [fzero if in_float else zero] * ROWS, [fzero] * ROWS
            for u in range(256 // n):
                first = builder.mul(bs[u], ir.Constant(V16I32, [-UNIT_SHIFT[qtype]] * 16)) \
                    if qtype in UNIT_SHIFT else zero  # the codes' offset times x's sum over the unit
                if in_float:
                    first = builder.add(first, ir.Constant(V16I32, [MAGIC] * 16))
                words = [builder.bitcast(b[2](u), ir.VectorType(I32, n // 4)) for b in blocks]
                dots = [first] * ROWS
                for g in range(n // 4):
                    y = vec(xt, builder.add(builder.mul(i, ir.Constant(I64, 64)), ir.Constant(I64, u * n // 4 + g)))
                    dots = [_dpbusd16(builder, dots[r], splat(builder, builder.extract_element(
                        words[r], ir.Constant(I32, g)), V16I32), y, vnni) for r in range(ROWS)]
                sums = bsf[u] if n == 16 else builder.fadd(bsf[2 * u], bsf[2 * u + 1])  # x's sums over the unit
                for r, (d, dmin, _, scales, mins) in enumerate(blocks):
                    if in_float:  # the sum's value: its bits as a float32 minus 1.5 * 2^23
                        value = builder.fsub(builder.bitcast(dots[r], V16F32), magic)
                        isums[r] = builder.call(fma, [value, fsplat(lane(scales, u)), isums[r]])
                    else:
                        isums[r] = builder.add(isums[r], builder.mul(dots[r], splat(builder, lane(scales, u), V16I32)))
                    if mins is not None:  # a min times x's sum: exact in float32
                        msums[r] = builder.call(fma, [sums, fsplat(lane(mins, u)), msums[r]])
                    if (u + 1) * n % step:
                        continue
                    isum = isums[r] if in_float else builder.sitofp(isums[r], V16F32)
                    if repacked:  # the gemm's float step
                        accs[2 * r] = builder.call(fma, [isum, builder.fmul(fsplat(d), dx), accs[2 * r]])
                        accs[2 * r + 1] = builder.call(fma, [msums[r], builder.fmul(fsplat(dmin), dx),
                                                             accs[2 * r + 1]])
                    else:  # the tiled kernel's, once a block
                        rr = builder.call(fma, [fsplat(builder.fneg(dmin)), msums[r], builder.fmul(isum, fsplat(d))])
                        accs[2 * r] = builder.call(fma, [rr, dx, accs[2 * r]])
                    isums[r], msums[r] = (fzero if in_float else zero), fzero
            return accs

        accs = counted_loop(builder, nb, [ir.Constant(V16F32, None)] * (2 * ROWS), block)
        for r in range(ROWS):
            at = builder.inttoptr(builder.add(out, ir.Constant(I64, 64 * r)), V16F32.as_pointer())
            builder.store(builder.fsub(accs[2 * r], accs[2 * r + 1]), at, align=4)
        return context.get_dummy_value()

    @intrinsic
    def lane_tile(typingctx, ws, xt, bt, bf, dt, nb, out):
        return types.none(types.UniTuple(types.int64, ROWS), *[types.int64] * 6), codegen

    return lane_tile


def _make_krow(qtype, vnni, n_rows, repacked):
    """An intrinsic (ws, x, bs, dx, nb) -> n_rows floats: one token's product with the n_rows rows at addresses ws,
    nb blocks each, side by side (several streams of weights per thread keep more reads in flight than one); dx: the
    token's Q8_K scales (float32, one per block). The float steps of GgmlMatrix's one-token paths: `repacked`
    x86's gemv (per block fma(isum, d_w * d_x, acc) and fma(msum, dmin_w * d_x, accm), then acc - accm), else
    ggml_vec_dot (8 lanes fma(d_x * d_w, lane, acc), Q4_K's mins in 4 lanes, Q5_K's as one sum; hsum_float_8)."""
    size = BLOCK_SIZES[qtype][1]
    v4, v4f = ir.VectorType(I32, 4), ir.VectorType(F32, 4)

    def codegen(context, builder, signature, args):
        ws, x, bs, dx, nb = args
        rows = [builder.extract_value(ws, r) for r in range(n_rows)]
        fma = builder.module.declare_intrinsic("llvm.fma.f32", fnty=ir.FunctionType(F32, [F32] * 3))
        fma4 = builder.module.declare_intrinsic("llvm.fma.v4f32", fnty=ir.FunctionType(v4f, [v4f] * 3))
        fma8 = builder.module.declare_intrinsic("llvm.fma.v8f32", fnty=ir.FunctionType(V8F32, [V8F32] * 3))
        msum_of = builder.module.declare_intrinsic("llvm.vector.reduce.add.v4i32", fnty=ir.FunctionType(I32, [v4]))
        isum_of = builder.module.declare_intrinsic("llvm.vector.reduce.add.v8i32", fnty=ir.FunctionType(I32, [V8I32]))

        def block(i, accs):
            xi, bsi = builder.add(x, builder.mul(i, ir.Constant(I64, 256))), builder.add(bs, builder.mul(i, ir.Constant(
                I64, 64)))
            dxi = load(builder, builder.add(dx, builder.mul(i, ir.Constant(I64, 4))), F32)
            out = []
            for r, w in enumerate(rows):
                acc, accm = accs[2 * r], accs[2 * r + 1]
                blk = builder.add(w, builder.mul(i, ir.Constant(I64, size)))
                d, dmin, lanes, m4, m8 = _kblock_sums(builder, blk, qtype, vnni, xi, bsi)
                if repacked:  # one total per block; the products d_w * d_x and dmin_w * d_x
                    isum = builder.sitofp(builder.call(isum_of, [lanes]), F32)
                    acc = builder.call(fma, [isum, builder.fmul(d, dxi), acc])
                    accm = builder.call(fma, [builder.sitofp(builder.call(msum_of, [m4]), F32), builder.fmul(dmin, dxi),
                                              accm])
                else:
                    neg = builder.fmul(builder.fneg(dxi), dmin)  # -d_x * dmin_w
                    if qtype == QT.Q2_K:  # its mins first, into the same lanes
                        acc = builder.call(fma8, [splat(builder, neg, V8F32), builder.sitofp(m8, V8F32), acc])
                    acc = builder.call(fma8, [splat(builder, builder.fmul(dxi, d), V8F32),
                                              builder.sitofp(lanes, V8F32), acc])
                    if qtype == QT.Q4_K:
                        accm = builder.call(fma4, [splat(builder, neg, v4f), builder.sitofp(m4, v4f), accm])
                    elif qtype == QT.Q5_K:
                        accm = builder.call(fma, [neg, builder.sitofp(builder.call(msum_of, [m4]), F32), accm])
                out += [acc, accm]
            return out

        if repacked:
            first = [ir.Constant(F32, 0.0)] * (2 * n_rows)
        else:
            first = [ir.Constant(V8F32, None), ir.Constant(v4f if qtype == QT.Q4_K else F32, None)] * n_rows
        accs = counted_loop(builder, nb, first, block)
        results = []
        for r in range(n_rows):
            acc, accm = accs[2 * r], accs[2 * r + 1]
            if repacked:
                results.append(builder.fsub(acc, accm))
                continue
            total = hsum(builder, acc)  # hsum_float_8: high half + low half, then (0 + 2) + (1 + 3)
            if qtype == QT.Q4_K:
                total = builder.fadd(total, hsum(builder, accm))
            elif qtype == QT.Q5_K:
                total = builder.fadd(total, accm)
            results.append(total)
        return context.make_tuple(builder, signature.return_type, results)

    @intrinsic
    def krow(typingctx, ws, x, bs, dx, nb):
        return types.UniTuple(types.float32, n_rows)(types.UniTuple(types.int64, n_rows), *[types.int64] * 4), codegen

    return krow


LTILE = KROW = KROWS = None  # one K-quant type's intrinsics (ROWS rows against a lane tile; one token's row, four)
REPACKED = SIZE = None  # whether the matrix is in llama.cpp's repacked x86 form; the type's block bytes


@njit(parallel=True, cache=True)
def _quantize_q8_K(X, four, rows):  # [T, K] f32 -> q [rows, K] i8, d [rows, K/256] f32, bsums [rows, K/16] i32
    """ggml_numerics.quantize_q8_K (which says why each step is as it is), the first `four` tokens in fours; rows
    past T are zeros."""
    T, K = X.shape
    q = np.zeros((rows, K), np.int8)
    d = np.zeros((rows, K // 256), np.float32)
    bsums = np.zeros((rows, K // 16), np.int32)
    for tb in prange(T * (K // 256)):
        t, b = tb // (K // 256), tb % (K // 256)
        x = X[t, b * 256:(b + 1) * 256]
        mx = x[0]
        for j in range(256):
            if abs(x[j]) > abs(mx):
                mx = x[j]
        if t < four and mx < 0:
            for j in range(256):
                if x[j] == -mx:
                    mx = -mx
                    break
        if mx == 0:
            continue
        iscale = np.float32(-127.0) / mx
        d[t, b] = np.float32(1.0) / iscale
        for j in range(256):
            c = min(np.float32(127.0), np.rint(x[j] * iscale))
            q[t, b * 256 + j] = np.int8(c)
            bsums[t, b * 16 + j // 16] += np.int32(c)
    return q, d, bsums


def _kquant_matmul(xq, dx, bsums, T, bases, starts):  # Q8_K x [>=T, K], the parts' addresses, first rows -> [T, N]
    """llama.cpp's path for each token, as GgmlMatrix.matmul picks it: one token through KROW (the gemv, or
    vec_dot); a repacked matrix's tokens in fours through the gemm (float steps every GEMM_STEP sub-blocks), the
    rest through the gemv; 8 or more tokens of a matrix not repacked through the tiled kernel (float steps per
    block); fewer, vec_dot each. The gemm and the tiled kernel run as lane tiles (LTILE: LANES tokens against ROWS
    rows); `xq`, `dx`, `bsums` have rows up to a multiple of LANES (zeros past the T tokens, results dropped)."""
    K = xq.shape[1]
    N, nb = starts[-1], K // 256
    out = np.empty((T, N), np.float32)
    if T == 1:  # one token: N_READ rows at a time (row_quad)
        n_quads = (N + N_READ - 1) // N_READ
        n_chunks = min(n_quads, 64)
        for c in prange(n_chunks):
            x0, b0, d0 = xq.ctypes.data, bsums.ctypes.data, dx.ctypes.data  # taken here: the arrays stay alive
            for q in range(c * n_quads // n_chunks, (c + 1) * n_quads // n_chunks):
                sums = KROWS(row_quad(bases, starts, q, N, nb * SIZE), x0, b0, d0, nb)
                for i in range(N_READ):
                    out[0, min(N_READ * q + i, N - 1)] = sums[i]
        return out
    tiled = T - T % 4 if REPACKED else (T if T >= 8 else 0)  # the tokens the tiles take
    n_tiles = (tiled + LANES - 1) // LANES
    xt, bt, dt = to_lanes(xq.view(np.int32), n_tiles), to_lanes(bsums, n_tiles), to_lanes(dx, n_tiles)
    bf = bt.astype(np.float32)
    n_groups = (N + ROWS - 1) // ROWS
    n_chunks = min(n_groups, 64)
    for c in prange(n_chunks):
        res = np.empty((ROWS, LANES), np.float32)
        w = np.zeros(8, np.int64)
        x0, b0, d0, r0 = xq.ctypes.data, bsums.ctypes.data, dx.ctypes.data, res.ctypes.data
        for g in range(c * n_groups // n_chunks, (c + 1) * n_groups // n_chunks):
            n0, rows = g * ROWS, min(ROWS, N - g * ROWS)
            for i in range(ROWS):
                w[i] = row_address(bases, starts, n0 + min(i, rows - 1), nb * SIZE)
            ws = (w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7])[:ROWS]
            for j in range(n_tiles):
                LTILE(ws, xt[j].ctypes.data, bt[j].ctypes.data, bf[j].ctypes.data, dt[j].ctypes.data, nb, r0)
                put_tile(out, res, j * LANES, n0, rows, min(LANES, tiled - j * LANES))
            for t in range(tiled, T):
                for i in range(rows):
                    out[t, n0 + i] = KROW((w[i],), x0 + t * K, b0 + t * (K // 16) * 4, d0 + t * nb * 4, nb)[0]
    return out


def kquant_kernel(qtype, vnni=VNNI, repacked=False):
    key = (qtype, vnni, repacked)
    if key not in KERNELS:
        consts = dict(LTILE=_make_lane_tile(qtype, vnni, repacked), KROW=_make_krow(qtype, vnni, 1, repacked),
                      KROWS=_make_krow(qtype, vnni, N_READ, repacked), REPACKED=repacked, SIZE=BLOCK_SIZES[qtype][1])
        name = f"kquant_matmul_{qtype.name}_{'repacked' if repacked else 'vec_dot'}_{'vnni' if vnni else 'generic'}"
        KERNELS[key] = specialize(_kquant_matmul, name, **consts)
    return KERNELS[key]


class NumbaKQuantMatrix(GgmlBlocks):
    """A K-quant matrix (Q2_K to Q6_K): `x @ w.T` is _kquant_matmul, equal to GgmlMatrix's to the bit; `repacked` as
    ggml_numerics.repacked (llama.cpp's CPU repack on, and a type and shape it repacks)."""

    def matmul(self, x):  # [T, K] -> [T, N]
        T, K = x.shape
        # rows up to a multiple of LANES, zeros: the tiles read them, their results are dropped
        xq, dx, bsums = _quantize_q8_K(np.ascontiguousarray(x, dtype=np.float32), T - T % 4 if self.repacked else 0,
                                       T if T == 1 else T + -T % LANES)
        return kquant_kernel(self.qtype, self.vnni, self.repacked)(xq, dx, bsums, T, self.bases, self.starts)


@njit(parallel=True, cache=True)
def _swiglu(gate, up):  # [T, F], [T, F] -> [T, F]: x / (1 + expf(-x)) * up, as ggml_vec_swiglu_f32
    out = np.empty_like(gate)
    T, F = gate.shape
    for t in prange(T):
        for i in range(F):
            x = gate[t, i]
            out[t, i] = x / (np.float32(1.0) + expf(-x)) * up[t, i]
    return out


@njit(cache=True)
def _reduce16(a):  # 16 lanes -> their sum in _mm512_reduce_add_ps's order
    for width in (8, 4, 2, 1):
        for i in range(width):
            a[i] = a[i] + a[width + i]
    return a[0]


@njit(cache=True)
def _fold64(lanes):  # [64, m] -> lanes[:16] = (0 + 2) + (1 + 3) of the four 16-lane accumulators (ggml_vec_dot_f16)
    for lane in range(16):
        for j in range(lanes.shape[1]):
            lanes[lane, j] = (lanes[lane, j] + lanes[32 + lane, j]) + (lanes[16 + lane, j] + lanes[48 + lane, j])


@njit(cache=True)
def _reduce16_rows(lanes):  # [>=16, m] -> lanes[0] = each column's 16 lanes summed as _reduce16 sums them
    for width in (8, 4, 2, 1):
        for lane in range(width):
            for j in range(lanes.shape[1]):
                lanes[lane, j] += lanes[width + lane, j]


@njit(parallel=True, cache=True)
def _softmax(kq, mask, scale):
    H, T, S = kq.shape
    out = np.empty_like(kq)
    for ht in prange(H * T):
        h, t = ht // T, ht % T
        w = np.empty(S, np.float32)
        mx = np.float32(-np.inf)
        for s in range(S):
            w[s] = kq[h, t, s] * scale + mask[t, s]
            mx = max(mx, w[s])
        lanes = np.zeros(16, np.float32)
        total = 0.0  # float64, as ggml_float
        for s in range(S):
            e = expf(w[s] - mx)
            out[h, t, s] = e
            lanes[s % 16] = e
            if s % 16 == 15 or s == S - 1:  # a group of 16 (the last padded with zeros)
                total += _reduce16(lanes)
                lanes[:] = 0.0
        inv = np.float32(1.0 / total)
        for s in range(S):
            out[h, t, s] *= inv
    return out


@njit(cache=True)
def _f16_sums(a, bt, out, many, padded):  # a [n], bt [n, m] f32 (float16 values) -> out [m]: sum_i a[i] * bt[i, j]
    """Dot products of a with each column of bt, added in ggml's order (ggml_numerics.f16_dots says which): lane l
    holds elements l, l + W, l + 2W, ..., W = 16 for a batch (tinyBLAS), 64 for one token (vec_dot_f16, whose
    n % 64 leftovers are added in float64 after its lanes, unless llama.cpp `padded` the row with zeros to whole
    lanes). Vectorized over the m columns."""
    n, m = bt.shape
    W = 16 if many else 64
    body = n if many or padded else n - n % 64
    used = body  # a's zeros at the end (the keys a causal row does not see) add nothing to any lane: skipped
    while used > 0 and a[used - 1] == 0:
        used -= 1
    lanes = np.zeros((W, m), np.float32)
    for c in range(0, used, W):
        for lane in range(min(W, used - c)):
            x = a[c + lane]
            for j in range(m):
                lanes[lane, j] += x * bt[c + lane, j]
    if not many:
        _fold64(lanes)
    _reduce16_rows(lanes)
    for j in range(m):
        total = np.float64(lanes[0, j])
        for i in range(body, n):
            total += np.float64(a[i] * bt[i, j])
        out[j] = np.float32(total)


kq_dot64 = _kq_dot(64)


@njit(parallel=True, cache=True)
def _scores_ir(qh, k):  # [T, H, HD] f32, [KVH, S, HD] f32 (float16 values; HD % 64 == 0, rows contiguous) -> [H, T, S]
    T, H, HD = qh.shape
    KVH, S, _ = k.shape
    out = np.empty((H, T, S), np.float32)
    for ht in prange(H * T):
        h, t = ht // T, ht % T
        q0, k0 = qh.ctypes.data + (t * H + h) * HD * 4, k.ctypes.data + (h // (H // KVH)) * k.strides[0]
        for s in range(S):
            if T == 1:
                out[h, t, s] = kq_dot64(q0, k0 + s * k.strides[1], HD // 64)
            else:
                out[h, t, s] = kq_dot16(q0, k0 + s * k.strides[1], HD // 16)
    return out


@intrinsic
def axpy_exact(typingctx, y, x, a, n):
    """(y, x, a, n): y[i] += a * x[i] for n chunks of 64 float32 values at addresses y and x (float16 values: each
    product is exact, so this is ggml's fma too)."""
    def codegen(context, builder, signature, args):
        y, x, a, n = args

        def chunk(c, _):
            at = builder.mul(c, ir.Constant(I64, 256))
            yp = builder.inttoptr(builder.add(y, at), V64F32.as_pointer())
            prod = builder.fmul(splat(builder, a, V64F32), load(builder, builder.add(x, at), V64F32))
            builder.store(builder.fadd(builder.load(yp, align=4), prod), yp, align=4)
            return []

        counted_loop(builder, n, [], chunk)
        return context.get_dummy_value()

    return types.none(types.int64, types.int64, types.float32, types.int64), codegen


@njit(parallel=True, cache=True)
def _mix_ir(p, v):  # [H, T, S] f32, [KVH, S, HD] f32 (float16 values; HD % 64 == 0, rows contiguous) -> [T, H, HD]
    """_f16_sums' order (64 lanes over the keys for one token, 16 for a batch; llama.cpp's zero padding adds
    nothing), each lane's row of HD sums accumulated in IR."""
    H, T, S = p.shape
    KVH, _, HD = v.shape
    W = 64 if T == 1 else 16
    out = np.empty((T, H, HD), np.float32)
    for ht in prange(H * T):
        h, t = ht // T, ht % T
        lanes = np.zeros((W, HD), np.float32)
        used = S
        while used > 0 and p[h, t, used - 1] == 0:  # a causal row's unseen keys: zeros add nothing to any lane
            used -= 1
        y0, v0 = lanes.ctypes.data, v.ctypes.data + (h // (H // KVH)) * v.strides[0]
        for s in range(used):
            axpy_exact(y0 + (s % W) * HD * 4, v0 + s * v.strides[1], _round_f16(p[h, t, s]), HD // 64)
        if W == 64:
            _fold64(lanes)
        _reduce16_rows(lanes)
        out[t, h] = lanes[0]
    return out


@njit(parallel=True, cache=True)
def _scores_f16(q, k):  # [T, H, HD] f32, [KVH, S, HD] f32 (float16 values) -> [H, T, S]
    """A batch: K transposed once, then _f16_sums along S. One token: each key's dot written out in the same
    order, reading K as stored (a transposed copy per step costs more than the step's sums)."""
    T, H, HD = q.shape
    KVH, S, _ = k.shape
    out = np.empty((H, T, S), np.float32)
    qh = np.empty((T, H, HD), np.float32)
    for t in range(T):
        for h in range(H):
            for d in range(HD):
                qh[t, h, d] = _round_f16(q[t, h, d])
    if T > 1:
        kt = np.empty((KVH, HD, S), np.float32)
        for g in prange(KVH):
            for s in range(S):
                for d in range(HD):
                    kt[g, d, s] = k[g, s, d]
        for ht in prange(H * T):
            h, t = ht // T, ht % T
            _f16_sums(qh[t, h], kt[h // (H // KVH)], out[h, t], HD % 16 == 0, False)  # else tinyBLAS declines
        return out
    body = HD - HD % 64
    for h in prange(H):
        acc = np.zeros(64, np.float32)
        for s in range(S):
            row = k[h // (H // KVH), s]
            if body:
                for lane in range(64):
                    acc[lane] = qh[0, h, lane] * row[lane]
            for c in range(64, body, 64):
                for lane in range(64):
                    acc[lane] += qh[0, h, c + lane] * row[c + lane]
            for lane in range(16):
                acc[lane] = (acc[lane] + acc[32 + lane]) + (acc[16 + lane] + acc[48 + lane])
            total = np.float64(_reduce16(acc))
            for d in range(body, HD):
                total += np.float64(qh[0, h, d] * row[d])
            out[h, 0, s] = np.float32(total)
    return out


@njit(parallel=True, cache=True)
def _mix_f16(p, vf):  # [H, T, S] f32, [KVH, S, HD] f32 (float16 values) -> [T, H, HD]
    H, T, S = p.shape
    KVH, _, HD = vf.shape
    out = np.empty((T, H, HD), np.float32)
    for ht in prange(H * T):
        h, t = ht // T, ht % T
        ph = np.empty(S, np.float32)
        for s in range(S):
            ph[s] = _round_f16(p[h, t, s])
        _f16_sums(ph, vf[h // (H // KVH)], out[t, h], T > 1, True)  # llama.cpp pads S to 256 with zeros
    return out


# ggml_numerics' four elementwise and attention steps, as Numba kernels (this module's OPS table; tests/test_ops.py
# and tests/test_ggml_numerics.py hold them bit-equal to the NumPy forms)
def swiglu(gate, up):  # [T, F], [T, F] -> [T, F]
    return _swiglu(np.ascontiguousarray(gate), np.ascontiguousarray(up))


def attention_weights(kq, mask, scale):  # [H, T, S], [T, S] -> [H, T, S]
    return _softmax(kq, np.ascontiguousarray(mask, dtype=np.float32), np.float32(scale))


def attention_scores(q, k):  # [T, H, HD] f32, [KVH, S, HD] f32 (float16 values) -> [H, T, S]
    if q.shape[2] % 64 == 0 and k.strides[2] == 4:  # each key's dot in IR, K read in place
        return _scores_ir(_round_f16s(np.ascontiguousarray(q)), k)
    return _scores_f16(np.ascontiguousarray(q), k)


def attention_mix(p, v):  # [H, T, S] f32, [KVH, S, HD] f32 (float16 values) -> [T, H*HD]
    if v.shape[2] % 64 == 0 and v.strides[2] == 4:  # the sums in IR, V read in place
        return _mix_ir(np.ascontiguousarray(p), v).reshape(p.shape[1], -1)
    return _mix_f16(p, v).reshape(p.shape[1], -1)


# numerics "ggml" on numba: ggml's RMSNorm and RoPE are numba_ops' own; GELU is a table lookup (NumPy is fast)
OPS = Ops(rms_norm=rms_norm, rope=ROPE, rope_cos_sin=rope_cos_sin, attention_scores=attention_scores,
          attention_weights=attention_weights, attention_mix=attention_mix, swiglu=swiglu, gelu=gelu, geglu=geglu,
          softcap=softcap, kv_f16=True, q_first=True,
          softmax=router_softmax, silu=silu)  # a router's, a gate's few values: the NumPy emulation
