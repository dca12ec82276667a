"""numerics "ggml" on `--backend numba`, the K-quants (Q2_K to Q6_K): llama.cpp's vec_dot, tiled and repacked
gemv/gemm float steps over exact integer sums, as LLVM IR kernels (the lanes and the ISA choice: ggml_blocks).
Activations are quantized to Q8_K in Numba; a batch runs as lane tiles, 16 tokens in a vector's lanes."""

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ..formats.ggml_types import BLOCK_SIZES
from ..formats.ggml_types import GGMLType as QT
from .block_ir import (
    bits32,
    broadcast_lane,
    const8,
    field_at,
    k_codes,
    k_crumbs,
    k_scales_mins,
    k_scales_mins_rows,
    prefetch_block,
    q3_k_scales,
    q6_k_codes,
    row_totals,
    rows_ahead,
)
from .ggml_blocks import ISA, MAGIC, V8F32, V8I32, V16F32, V16I32, GgmlBlocks, _dpbusd16, _lanes
from .ggml_tables import LAYOUT
from .ggml_x86 import GEMM_STEP
from .ir import F32, I8, I16, I32, I64, V32I8, counted_loop, declare, hsum, lanes, load, load_f16, specialize, splat
from .quant import N_READ, TILE_T, WIDE, part_of, put_tile, row_address, row_quad, to_lanes

K_QUANTS = (QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K)


def _kblock_sums(builder, blk, qtype, isa, x, bs, ahead, both=None):
    """IR of one K-quant block of 256 weights at blk against a token's Q8_K block: its int8 codes at x and their
    int32 sums of 16 at bs. -> (d, dmin, lanes, mins, mins8), exact int32 sums of the codes' products times their
    sub-block scales: `lanes` <8 x i32>, element e of the block in lane (e % 32) // 4 (ggml_vec_dot's lanes; Q6_K's
    codes 0..63, each lane l taking back 32 * scale * x's sums of the sub-blocks 2l and 2l + 1; Q3_K's codes the
    two low bits minus 4 where the high bit is clear, two products a lane as ggml's), `mins` <4 x i32> the mins
    times x's sums, by 64 elements (Q4_K/Q5_K/Q2_K; zero for Q6_K and Q3_K) and `mins8` Q2_K's by 32 (its
    vec_dot's 8 lanes; None for the others). both: Q4_K/Q5_K's k_scales_mins where the caller has them."""
    v4, v8, v16 = ir.VectorType(I32, 4), V8I32, ir.VectorType(I32, 16)
    prefetch_block(builder, blk, qtype, ahead)
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
        if both is None:
            both = k_scales_mins(builder, blk, qtype)  # scales in lanes 0-7, mins in 8-15
        scales = [broadcast_lane(builder, both, j, 8) for j in range(8)]
        mins = builder.shuffle_vector(both, both, ir.Constant(v8, list(range(8, 16))))
        dmin = load_f16(builder, field_at(builder, blk, qtype, "dmin"))
    # AVX2: scales as _lanes takes them, each lane's in two int16 (the types' scales all fit): by 16, each scale in
    # both halves of a 32-bit word, a chunk's two picked by one 32-bit shuffle (vpermd); else one broadcast
    if by_16:
        src = sc16 if isa != "avx2" else builder.or_(builder.and_(sc16, ir.Constant(v16, [0xFFFF] * 16)),
                                                     builder.shl(sc16, ir.Constant(v16, [16] * 16)))
        scales = [builder.shuffle_vector(src, src, ir.Constant(v8, [2 * c] * 4 + [2 * c + 1] * 4)) for c in range(8)]
        if isa == "avx2":
            scales = [builder.bitcast(s, ir.VectorType(I16, 16)) for s in scales]
    elif isa == "avx2":
        s16 = builder.trunc(both, ir.VectorType(I16, 16))
        scales = [builder.shuffle_vector(s16, s16, ir.Constant(v16, [c] * 16)) for c in range(8)]
    evens, odds = (ir.Constant(v8, list(range(o, 16, 2))) for o in (0, 1))

    def halves(v):  # <8 x i32> -> <4 x i32>: lanes 2k + 2k + 1
        return builder.add(builder.shuffle_vector(v, v, ir.Constant(v4, [0, 2, 4, 6])),
                           builder.shuffle_vector(v, v, ir.Constant(v4, [1, 3, 5, 7])))

    def chunk(c):  # chunk c's 8 lanes of code products, times their scales
        y = load(builder, builder.add(x, ir.Constant(I64, 32 * c)), V32I8)
        if qtype == QT.Q3_K:
            return builder.sub(*[_lanes(builder, codes[c][k], y, isa, scales[c]) for k in (0, 1)])
        return _lanes(builder, codes[c], y, isa, scales[c])

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
K_TILE_N = 4 if WIDE else 1  # rows of weights a K-quant tile multiplies at once: what 32 (16, AVX2) registers hold


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


def _make_lane_tile(qtype, isa, form):
    """An intrinsic (ws, xt, bt, bf, dt, nb, out): the K_TILE_N rows at addresses ws, nb blocks each, against TILE_T
    tokens, the tokens in the lanes of a vector. xt: the tokens' Q8_K codes, 4 at a time ([K/4, TILE_T] words); bt,
    bf: their sums of 16 ([K/16, TILE_T], int32 and float32); dt: their scales ([nb, TILE_T] float32); out: the
    [K_TILE_N, TILE_T] float32 results. Each weight's 4 codes are broadcast to every lane and one vpdpbusd adds their
    products with all the tokens' (the codes unsigned, x signed: a code's offset is taken back from x's sums), so
    no sum is ever reduced across lanes; each vector of x is read once for the K_TILE_N rows. Each token's float steps
    are its own lane's, by `form`: the repacked "gemm"'s (fma(isum, d_w * d_x, acc) and fma(msum, dmin_w * d_x,
    accm) every GEMM_STEP sub-blocks of 32, then acc - accm), the repacked "gemv"'s (the same, once a block) or the
    "tiled" kernel's (per block r = isum * d_w, r = fma(-dmin_w, msum, r), acc = fma(r, d_x, acc)). A step's
    integer sums times their scales are added in float32 where every partial sum stays below 2^24 (exact: an FMA
    instead of a 32-bit multiply; each vpdpbusd sum then starts from MAGIC, so that its float32 value is its bits
    minus 1.5 * 2^23, a subtraction either FMA unit takes instead of a conversion only one does), else in int32;
    msum always is."""
    size = BLOCK_SIZES[qtype][1]
    step = 32 * GEMM_STEP[qtype] if form == "gemm" else 256  # values per float step
    n, top, scale_top = UNIT_BOUNDS[qtype]
    in_float = step // n * n * top * 127 * scale_top < 2 ** 24  # a step's scaled sums exact in float32

    def codegen(context, builder, signature, args):
        ws, xt, bt, bf, dt, nb, out = args
        rows = [builder.extract_value(ws, r) for r in range(K_TILE_N)]
        ahead = rows_ahead(builder, builder.mul(nb, ir.Constant(I64, size)), K_TILE_N)
        fma = declare(builder, "llvm.fma.v16f32", V16F32, V16F32, V16F32, V16F32)
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
                prefetch_block(builder, blk, qtype, ahead)
                d, dmin, codes, scales, mins = _kunits(builder, blk, qtype)
                if in_float:  # converted once a block
                    scales = builder.sitofp(scales, ir.VectorType(F32, scales.type.count))
                if mins is not None:
                    mins = builder.sitofp(mins, ir.VectorType(F32, mins.type.count))
                blocks.append((d, dmin, codes, scales, mins))
            accs = list(accs)
            isums, msums = [fzero if in_float else zero] * K_TILE_N, [fzero] * K_TILE_N
            for u in range(256 // n):
                first = builder.mul(bs[u], ir.Constant(V16I32, [-UNIT_SHIFT[qtype]] * 16)) \
                    if qtype in UNIT_SHIFT else zero  # the codes' offset times x's sum over the unit
                if in_float:
                    first = builder.add(first, ir.Constant(V16I32, [MAGIC] * 16))
                words = [builder.bitcast(b[2](u), ir.VectorType(I32, n // 4)) for b in blocks]
                dots = [first] * K_TILE_N
                for g in range(n // 4):
                    y = vec(xt, builder.add(builder.mul(i, ir.Constant(I64, 64)), ir.Constant(I64, u * n // 4 + g)))
                    dots = [_dpbusd16(builder, dots[r], splat(builder, builder.extract_element(
                        words[r], ir.Constant(I32, g)), V16I32), y, isa) for r in range(K_TILE_N)]
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
                    if form != "tiled":  # the repacked gemm's or gemv's float step
                        accs[2 * r] = builder.call(fma, [isum, builder.fmul(fsplat(d), dx), accs[2 * r]])
                        accs[2 * r + 1] = builder.call(fma, [msums[r], builder.fmul(fsplat(dmin), dx),
                                                             accs[2 * r + 1]])
                    else:  # the tiled kernel's, once a block
                        rr = builder.call(fma, [fsplat(builder.fneg(dmin)), msums[r], builder.fmul(isum, fsplat(d))])
                        accs[2 * r] = builder.call(fma, [rr, dx, accs[2 * r]])
                    isums[r], msums[r] = (fzero if in_float else zero), fzero
            return accs

        accs = counted_loop(builder, nb, [ir.Constant(V16F32, None)] * (2 * K_TILE_N), block)
        for r in range(K_TILE_N):
            at = builder.inttoptr(builder.add(out, ir.Constant(I64, 64 * r)), V16F32.as_pointer())
            builder.store(builder.fsub(accs[2 * r], accs[2 * r + 1]), at, align=4)
        return context.get_dummy_value()

    @intrinsic
    def lane_tile(typingctx, ws, xt, bt, bf, dt, nb, out):
        return types.none(types.UniTuple(types.int64, K_TILE_N), *[types.int64] * 6), codegen

    return lane_tile


def _make_krow(qtype, isa, n_rows, repacked):
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
        ahead = rows_ahead(builder, builder.mul(nb, ir.Constant(I64, size)), n_rows)
        fma = declare(builder, "llvm.fma.f32", F32, F32, F32, F32)
        fma4 = declare(builder, "llvm.fma.v4f32", v4f, v4f, v4f, v4f)
        fma8 = declare(builder, "llvm.fma.v8f32", V8F32, V8F32, V8F32, V8F32)
        msum_of = declare(builder, "llvm.vector.reduce.add.v4i32", I32, v4)
        vrows = ir.VectorType(F32, n_rows)
        fma_rows = declare(builder, f"llvm.fma.v{n_rows}f32", vrows, vrows, vrows, vrows)

        def block(i, accs):
            xi, bsi = builder.add(x, builder.mul(i, ir.Constant(I64, 256))), builder.add(bs, builder.mul(i, ir.Constant(
                I64, 64)))
            dxi = load(builder, builder.add(dx, builder.mul(i, ir.Constant(I64, 4))), F32)
            blks = [builder.add(w, builder.mul(i, ir.Constant(I64, size))) for w in rows]
            boths = [None] * n_rows  # the scales unpacked a row at a time, or (AVX2, where it is faster) side by side
            if qtype in (QT.Q4_K, QT.Q5_K) and isa == "avx2":
                boths = k_scales_mins_rows(builder, blks, qtype)
            sums = (_kblock_sums(builder, blk, qtype, isa, xi, bsi, ahead, both)
                    for blk, both in zip(blks, boths, strict=True))
            out = []  # vec_dot: each row's float steps after its sums (a generator: emitted in that order)
            if repacked:  # one total per block and row, the rows in the lanes; the products d_w * d_x, dmin_w * d_x
                sums = list(sums)

                def per_row(k):  # the rows' k-th fields, one a lane
                    v = ir.Constant(vrows, ir.Undefined)
                    for r, s in enumerate(sums):
                        v = builder.insert_element(v, s[k], ir.Constant(I32, r))
                    return v

                dxs, accs = splat(builder, dxi, vrows), list(accs)
                for a, k in ((0, 2), (1, 3)):  # isum (lanes) times d, msum (mins) times dmin
                    total = builder.sitofp(row_totals(builder, [s[k] for s in sums]), vrows)
                    accs[a] = builder.call(fma_rows, [total, builder.fmul(per_row(a), dxs), accs[a]])
                return accs
            for r, (d, dmin, isums, m4, m8) in enumerate(sums):
                acc, accm = accs[2 * r], accs[2 * r + 1]
                neg = builder.fmul(builder.fneg(dxi), dmin)  # -d_x * dmin_w
                if qtype == QT.Q2_K:  # its mins first, into the same lanes
                    acc = builder.call(fma8, [splat(builder, neg, V8F32), builder.sitofp(m8, V8F32), acc])
                acc = builder.call(fma8, [splat(builder, builder.fmul(dxi, d), V8F32),
                                          builder.sitofp(isums, V8F32), acc])
                if qtype == QT.Q4_K:
                    accm = builder.call(fma4, [splat(builder, neg, v4f), builder.sitofp(m4, v4f), accm])
                elif qtype == QT.Q5_K:
                    accm = builder.call(fma, [neg, builder.sitofp(builder.call(msum_of, [m4]), F32), accm])
                out += [acc, accm]
            return out

        if repacked:
            first = [ir.Constant(vrows, None)] * 2
        else:
            first = [ir.Constant(V8F32, None), ir.Constant(v4f if qtype == QT.Q4_K else F32, None)] * n_rows
        accs = counted_loop(builder, nb, first, block)
        if repacked:
            diff = builder.fsub(*accs)
            return context.make_tuple(builder, signature.return_type, [builder.extract_element(
                diff, ir.Constant(I32, r)) for r in range(n_rows)])
        results = []
        for r in range(n_rows):
            acc, accm = accs[2 * r], accs[2 * r + 1]
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


def _q4k_sums_vnni(builder, x, bs, nb, i, blks):
    """A repacked Q4_K matrix's integer sums on AVX-512 VNNI, in 512-bit registers. A 64-byte load of codes holds two
    sub-blocks' worth in each nibble half (low nibbles sub-blocks 2p and 2p + 2, high ones 2p + 1 and 2p + 3), so x's
    32-byte chunks come paired to match, and its sums of 32 as int16 once for each row (_q4_k_pairs, once a token); a
    vpdpbusd sums each 4 products (at most 4 * 15 * 127, an int16), and a vpdpwssd multiplies those by their
    sub-block's scale and adds them (each int32 lane read as two int16: the sum and its sign, the scale and 0): two
    instructions a 64 codes where the ggml_vec_dot lanes take a vpdpbusd, a vpmulld and an add a 32."""
    v64i8 = ir.VectorType(I8, 64)
    pairs = ((0, 2), (1, 3), (4, 6), (5, 7))  # the sub-blocks in a code vector's two halves
    dpbusd, dpwssd = (declare(builder, f"llvm.x86.avx512.{op}.512", V16I32, V16I32, V16I32, V16I32)
                      for op in ("vpdpbusd", "vpdpwssd"))
    low4, zero = ir.Constant(v64i8, [15] * 64), ir.Constant(V16I32, None)
    xi = builder.add(x, builder.mul(i, ir.Constant(I64, 256)))
    xs = [load(builder, builder.add(xi, ir.Constant(I64, 64 * c)), V16I32) for c in range(4)]  # _q4_k_pairs'
    by_32 = load(builder, builder.add(bs, builder.mul(i, ir.Constant(I64, 64))), V16I32)
    boths = k_scales_mins_rows(builder, blks, QT.Q4_K)  # a row's scales in lanes 0-7, mins in 8-15
    isums = []
    for blk, both in zip(blks, boths, strict=True):
        qs = [load(builder, field_at(builder, blk, QT.Q4_K, "qs", 64 * h), v64i8) for h in (0, 1)]
        codes = [c for q in qs for c in (builder.and_(q, low4), builder.and_(builder.lshr(
            q, ir.Constant(v64i8, [4] * 64)), low4))]
        acc = zero
        for c, (a, b) in enumerate(pairs):
            dots = builder.call(dpbusd, [zero, builder.bitcast(codes[c], V16I32), xs[c]])
            scale = builder.shuffle_vector(both, both, ir.Constant(V16I32, [a] * 8 + [b] * 8))
            acc = builder.call(dpwssd, [acc, dots, scale])
        isums.append(acc)
    mins = [builder.trunc(lanes(builder, both, 8, 8), ir.VectorType(I16, 8)) for both in boths]
    mins = builder.shuffle_vector(*[builder.shuffle_vector(mins[k], mins[k + 1], ir.Constant(
        ir.VectorType(I32, 16), list(range(16)))) for k in (0, 2)], ir.Constant(ir.VectorType(I32, 32), list(
            range(32))))
    msums = builder.call(dpwssd, [zero, builder.bitcast(mins, V16I32), by_32])  # row r in lanes 4r .. 4r + 3
    return row_totals(builder, isums), row_totals(builder, [lanes(builder, msums, 4 * r, 4) for r in range(
        len(blks))])


def _q4k_sums_avx2(builder, x, bs, nb, i, blks):
    """A repacked Q4_K matrix's integer sums on AVX2, in fewer instructions than the vec_dot lanes' form: each 32
    codes one vpmaddubsw and one vpmaddwd by the sub-block's scale, picked from the row's scales by one vpshufb (as
    ggml's AVX2 vec_dot), the mins one 128-bit vpmaddwd a row against x's sums of 32 (taken once a block for the
    rows), no reduction until the rows' totals, side by side. Two things keep LLVM from making it slower: the
    vpshufb masks and each row's x address hold a zero it cannot see (nb < 0, where no iteration runs), else it
    lowers a constant byte shuffle in two or three instructions (with SSE4a, extrq: slow beside 256-bit code) and
    keeps the x chunks the rows share in registers, spilling them, where each row can read them again from L1."""
    v4, v8i16, v16i16 = ir.VectorType(I32, 4), ir.VectorType(I16, 8), ir.VectorType(I16, 16)

    maddubs = declare(builder, "llvm.x86.avx2.pmadd.ub.sw", v16i16, V32I8, V32I8)
    madd = declare(builder, "llvm.x86.avx2.pmadd.wd", V8I32, v16i16, v16i16)
    madd4 = declare(builder, "llvm.x86.sse2.pmadd.wd", v4, v8i16, v8i16)
    pick = declare(builder, "llvm.x86.avx2.pshuf.b", V32I8, V32I8, V32I8)
    low4, hidden = ir.Constant(V32I8, [15] * 32), builder.lshr(nb, ir.Constant(I64, 63))
    scale_of = [builder.or_(ir.Constant(V32I8, [2 * j, 2 * j + 1] * 16), splat(builder, builder.trunc(
        hidden, I8), V32I8)) for j in range(8)]  # sub-block j's int16 scale, 16 times
    sums = load(builder, builder.add(bs, builder.mul(i, ir.Constant(I64, 64))), ir.VectorType(I32, 16))
    by_32 = builder.trunc(builder.add(*[builder.shuffle_vector(sums, sums, ir.Constant(V8I32, list(range(
        o, 16, 2)))) for o in (0, 1)]), v8i16)  # x's 16 sums of 16 -> 8 of 32, as int16 (|s| <= 4064)
    isums, msums = [], []
    for r, (blk, both) in enumerate(zip(blks, k_scales_mins_rows(builder, blks, QT.Q4_K), strict=True)):
        xr = builder.add(builder.add(x, builder.mul(hidden, ir.Constant(I64, r))), builder.mul(i, ir.Constant(
            I64, 256)))
        s16 = builder.trunc(both, v16i16)  # scales in lanes 0-7, mins in 8-15
        scales = builder.bitcast(builder.shuffle_vector(s16, s16, ir.Constant(ir.VectorType(I32, 16), list(
            range(8)) * 2)), V32I8)  # in both 128-bit halves, as vpshufb reads them
        acc = None
        for p in range(4):  # 32 bytes: sub-block 2p's codes in the low nibbles, 2p + 1's in the high ones
            q = load(builder, field_at(builder, blk, QT.Q4_K, "qs", 32 * p), V32I8)
            high = builder.bitcast(builder.lshr(builder.bitcast(q, v16i16), ir.Constant(v16i16, [4] * 16)), V32I8)
            for j, codes in ((2 * p, builder.and_(q, low4)), (2 * p + 1, builder.and_(high, low4))):
                y = load(builder, builder.add(xr, ir.Constant(I64, 32 * j)), V32I8)
                scale = builder.bitcast(builder.call(pick, [scales, scale_of[j]]), v16i16)
                dots = builder.call(madd, [builder.call(maddubs, [codes, y]), scale])
                acc = dots if acc is None else builder.add(acc, dots)
        isums.append(acc)
        msums.append(builder.call(madd4, [builder.trunc(lanes(builder, both, 8, 8), v8i16), by_32]))
    return row_totals(builder, isums), row_totals(builder, msums)


def _make_q4k_rows(isa):
    """KROWS of a repacked Q4_K matrix on AVX-512 VNNI or AVX2: the x86 gemv's float steps (per block, the rows in
    the lanes, fma(isum, d_w * d_x, acc) and fma(msum, dmin_w * d_x, accm), then acc - accm) over the same exact
    integers as _make_krow's, summed in fewer instructions (_q4k_sums_vnni, _q4k_sums_avx2)."""
    size, n_rows = BLOCK_SIZES[QT.Q4_K][1], N_READ
    vrows = ir.VectorType(F32, n_rows)
    sums_of = _q4k_sums_vnni if isa == "vnni" else _q4k_sums_avx2

    def codegen(context, builder, signature, args):
        ws, x, bs, dx, nb = args
        rows = [builder.extract_value(ws, r) for r in range(n_rows)]
        ahead = rows_ahead(builder, builder.mul(nb, ir.Constant(I64, size)), n_rows)
        fma_rows = declare(builder, f"llvm.fma.v{n_rows}f32", vrows, vrows, vrows, vrows)

        def block(i, accs):
            dxi = load(builder, builder.add(dx, builder.mul(i, ir.Constant(I64, 4))), F32)
            blks = [builder.add(w, builder.mul(i, ir.Constant(I64, size))) for w in rows]
            for blk in blks:
                prefetch_block(builder, blk, QT.Q4_K, ahead)
            isum, msum = sums_of(builder, x, bs, nb, i, blks)

            def per_row(field):  # the rows' float16 field, one a lane
                v = ir.Constant(vrows, ir.Undefined)
                for r, blk in enumerate(blks):
                    v = builder.insert_element(v, load_f16(builder, field_at(builder, blk, QT.Q4_K, field)),
                                               ir.Constant(I32, r))
                return v

            dxs = splat(builder, dxi, vrows)
            return [builder.call(fma_rows, [builder.sitofp(total, vrows), builder.fmul(per_row(field), dxs), acc])
                    for acc, total, field in ((accs[0], isum, "d"), (accs[1], msum, "dmin"))]

        accs = counted_loop(builder, nb, [ir.Constant(vrows, None)] * 2, block)
        diff = builder.fsub(*accs)
        return context.make_tuple(builder, signature.return_type, [builder.extract_element(
            diff, ir.Constant(I32, r)) for r in range(n_rows)])

    @intrinsic
    def krows(typingctx, ws, x, bs, dx, nb):
        return types.UniTuple(types.float32, n_rows)(types.UniTuple(types.int64, n_rows), *[types.int64] * 4), codegen

    return krows


LTILE = GTILE = KROWS = None  # one K-quant type's intrinsics: K_TILE_N rows against a lane tile (the form's; the
# repacked gemv's), one token against N_READ rows
REPACKED = SIZE = PAIRS = None  # whether the matrix is in llama.cpp's repacked x86 form; the type's block bytes;
# whether one token's x is paired for _q4k_sums_vnni
FEW = None  # a repacked matrix's mul_mat_id rows at most this many go one at a time (FEW_ROWS)
FEW_ROWS = {"avx2": 8}  # by CPU path (others 4): a lane tile's 16 lanes cost alike for 1 to 16 rows, one token's
# kernel less up to this many (docs/performance.md)


def q4_k_rows_vnni(qtype, isa, repacked):
    return (qtype, isa, repacked) == (QT.Q4_K, "vnni", True) and WIDE


@njit(cache=True)
def _q4_k_pairs(xq, bsums):  # [P, K] i8, [P, K/16] i32 -> [P, K] i8, [P, K/16] i32: _q4k_sums_vnni's x
    """Each block's 32-code chunks in the order 0, 2, 1, 3, 4, 6, 5, 7 (the nibbles' pairs), and its 8 sums of 32
    as int16, the 8 repeated 4 times (a row quad's), in the sums' place (64 bytes a block either way)."""
    P, K = xq.shape
    pairs = np.empty_like(xq)
    sums = np.empty((P, K // 256 * 32), np.int16)
    for p in range(P):
        for b in range(K // 256):
            for c in range(8):
                at = 256 * b + 32 * (c // 4 * 4 + (c % 4) // 2 + 2 * (c % 2))  # chunk c's source
                pairs[p, 256 * b + 32 * c:256 * b + 32 * c + 32] = xq[p, at:at + 32]
                total = bsums[p, 16 * b + 2 * c] + bsums[p, 16 * b + 2 * c + 1]
                for r in range(4):
                    sums[p, 32 * b + 8 * r + c] = total
    return pairs, sums.view(np.int32)


def _quantize_q8_K(X, four, rows):  # [T, K] f32 -> q [rows, K] i8, d [rows, K/256] f32, bsums [rows, K/16] i32
    """ggml_quantize.quantize_q8_K (which says why each step is as it is), the first `four` tokens in fours; rows
    past T are zeros."""
    T, K = X.shape
    q = np.zeros((rows, K), np.int8)
    d = np.zeros((rows, K // 256), np.float32)
    bsums = np.zeros((rows, K // 16), np.int32)
    for tb in prange(T * (K // 256)):
        t, b = tb // (K // 256), tb % (K // 256)
        x = X[t, b * 256:(b + 1) * 256]
        top = np.float32(0.0)
        for j in range(256):  # the largest |x| (a loop LLVM vectorizes), then the first value that has it
            top = max(top, abs(x[j]))
        mx = top
        for j in range(256):
            if abs(x[j]) == top:
                mx = x[j]
                break
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
            q[t, b * 256 + j] = np.int8(min(np.float32(127.0), np.rint(x[j] * iscale)))
        for j in range(256):
            bsums[t, b * 16 + j // 16] += np.int32(q[t, b * 256 + j])
    return q, d, bsums


quantize_q8_K_many = specialize(_quantize_q8_K, "quantize_q8_K_many")
quantize_q8_K_one = specialize(_quantize_q8_K, "quantize_q8_K_one", parallel=False)  # a thread pool's start costs
# more than one token's quantization


def _kquant_matmul(xq, dx, bsums, T, bases, starts, gemv, per_part):  # Q8_K x [>=T, K], the parts' addresses and
    """first rows -> [T, N]. llama.cpp's path for each token, as GgmlMatrix.matmul picks it: one token through KROWS
    (the gemv, or vec_dot), or (`per_part`, T = 1) each part's rows through it with their own row of x (one token's
    experts, parts of whole quads); a repacked matrix's tokens in fours through the gemm (float steps every
    GEMM_STEP sub-blocks), the rest through the gemv, or (`gemv`: mul_mat_id's form) every token through the gemv's
    float steps (up to FEW tokens: each through KROWS); 8 or more tokens of a matrix not repacked through the tiled
    kernel (float steps per block); fewer, vec_dot each. The gemm, the tiled kernel and a batch's gemv run as lane
    tiles (LTILE, GTILE: TILE_T tokens against K_TILE_N rows); the tokens they do not take, one at a time through
    KROWS; `xq`, `dx`, `bsums` have rows up to a multiple of TILE_T (zeros past the T tokens, results dropped)."""
    K = xq.shape[1]
    N, nb = starts[-1], K // 256
    out = np.empty((T, N), np.float32)
    # the tokens the tiles take; a few rows of a repacked matrix's mul_mat_id go as single tokens (fewer passes)
    tiled = 0 if T == 1 or (gemv and T <= FEW) else T if gemv else T - T % 4 if REPACKED else (T if T >= 8 else 0)
    if tiled < T:  # the others one token at a time, N_READ rows side by side (row_quad)
        xw, sw = _q4_k_pairs(xq[tiled:], bsums[tiled:]) if PAIRS else (xq[tiled:], bsums[tiled:])
        dw = dx[tiled:]
        n_quads = (N + N_READ - 1) // N_READ
        n_chunks = min(n_quads, 64)
        for c in prange(n_chunks):
            x0, b0, d0 = xw.ctypes.data, sw.ctypes.data, dw.ctypes.data  # taken here: the arrays stay alive
            for q in range(c * n_quads // n_chunks, (c + 1) * n_quads // n_chunks):
                for t in range(T - tiled):
                    p = part_of(starts, N_READ * q) if per_part else t
                    sums = KROWS(row_quad(bases, starts, q, N, nb * SIZE), x0 + p * K, b0 + p * (K // 16) * 4,
                                 d0 + p * nb * 4, nb)
                    for i in range(N_READ):
                        out[tiled + t, min(N_READ * q + i, N - 1)] = sums[i]
    if tiled == 0:
        return out
    n_tiles = (tiled + TILE_T - 1) // TILE_T
    xt, bt, dt = to_lanes(xq.view(np.int32), n_tiles), to_lanes(bsums, n_tiles), to_lanes(dx, n_tiles)
    bf = bt.astype(np.float32)
    n_groups = (N + K_TILE_N - 1) // K_TILE_N
    n_chunks = min(n_groups, 64)
    for c in prange(n_chunks):
        res = np.empty((K_TILE_N, TILE_T), np.float32)
        w = np.zeros(8, np.int64)
        r0 = res.ctypes.data
        for g in range(c * n_groups // n_chunks, (c + 1) * n_groups // n_chunks):
            n0, rows = g * K_TILE_N, min(K_TILE_N, N - g * K_TILE_N)
            for i in range(K_TILE_N):
                w[i] = row_address(bases, starts, n0 + min(i, rows - 1), nb * SIZE)
            ws = (w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7])[:K_TILE_N]
            for j in range(n_tiles):
                if gemv:  # every token through the gemv's float steps, as lanes
                    GTILE(ws, xt[j].ctypes.data, bt[j].ctypes.data, bf[j].ctypes.data, dt[j].ctypes.data, nb, r0)
                else:
                    LTILE(ws, xt[j].ctypes.data, bt[j].ctypes.data, bf[j].ctypes.data, dt[j].ctypes.data, nb, r0)
                put_tile(out, res, j * TILE_T, n0, rows, min(TILE_T, tiled - j * TILE_T))
    return out


KERNELS = {}  # (qtype, isa, repacked) -> compiled _kquant_matmul, made on first use


def kquant_kernel(qtype, isa=ISA, repacked=False):
    key = (qtype, isa, repacked)
    if key not in KERNELS:
        tile = _make_lane_tile(qtype, isa, "gemm" if repacked else "tiled")
        q4_k_rows = q4_k_rows_vnni(qtype, isa, repacked) or key == (QT.Q4_K, "avx2", True)
        consts = dict(LTILE=tile, GTILE=_make_lane_tile(qtype, isa, "gemv") if repacked else tile,
                      KROWS=_make_q4k_rows(isa) if q4_k_rows else _make_krow(qtype, isa, N_READ, repacked),
                      REPACKED=repacked, SIZE=BLOCK_SIZES[qtype][1],
                      PAIRS=q4_k_rows_vnni(qtype, isa, repacked), FEW=FEW_ROWS.get(isa, 4))
        name = f"kquant_matmul_{qtype.name}_{'repacked' if repacked else 'vec_dot'}_{isa}"
        KERNELS[key] = specialize(_kquant_matmul, name, **consts)
    return KERNELS[key]


class NumbaKQuantMatrix(GgmlBlocks):
    """A K-quant matrix (Q2_K to Q6_K): `x @ w.T` is _kquant_matmul, equal to GgmlMatrix's to the bit; `repacked` as
    ggml_numerics.repacked (llama.cpp's CPU repack on, and a type and shape it repacks)."""

    def matmul(self, x, gemv=False):  # [T, K] -> [T, N]
        T, K = x.shape
        # rows up to a multiple of TILE_T, zeros: the tiles read them, their results are dropped
        quantize = quantize_q8_K_one if T == 1 else quantize_q8_K_many
        xq, dx, bsums = quantize(np.ascontiguousarray(x, dtype=np.float32),
                                       T - T % 4 if self.repacked and not gemv else 0, T if T == 1 else T + -T % TILE_T)
        return kquant_kernel(self.qtype, self.isa, self.repacked)(xq, dx, bsums, T, self.bases, self.starts, gemv,
                                                                   False)

    def matmul_id(self, x):  # [T, K] -> [T, N]: llama.cpp's mul_mat_id (a repacked matrix: the gemv on each row)
        return self.matmul(x, gemv=self.repacked)

    def quantize_rows(self, x):  # [T, K] -> x's rows in Q8_K, once for every expert that reads them (matmul_rows)
        return quantize_q8_K_many(np.ascontiguousarray(x, dtype=np.float32), 0, len(x))

    def matmul_rows(self, q, rows):  # quantize_rows' Q8_K, [n] row ids -> [n, N]: matmul_id of those rows of x
        """llama.cpp's mul_mat_id quantizes its input once and gathers each expert's rows; its quantization is a
        row's own (gemv's: no rows in fours), so the rows gathered are those each expert's call would make."""
        n = len(rows)
        padded = n if n == 1 else n + -n % TILE_T  # zero rows to a multiple of TILE_T, as matmul's
        xq, dx, bsums = (np.zeros((padded, *a.shape[1:]), a.dtype) for a in q)
        for gathered, a in zip((xq, dx, bsums), q, strict=True):
            gathered[:n] = a[rows]
        return kquant_kernel(self.qtype, self.isa, self.repacked)(xq, dx, bsums, n, self.bases, self.starts,
                                                                   self.repacked, False)

    def matmul_parts(self, X):  # [P, K] -> [1, N]: part p's rows times X[p], each as one token's product
        xq, dx, bsums = quantize_q8_K_one(np.ascontiguousarray(X, dtype=np.float32), 0, len(X))
        return kquant_kernel(self.qtype, self.isa, self.repacked)(xq, dx, bsums, 1, self.bases, self.starts, True,
                                                                   True)
