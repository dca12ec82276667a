"""numerics "ggml" on `--backend numba`, the blocks of 32: llama.cpp's integer dot products of Q4_0, Q4_1, Q5_0 and
Q8_0 as Numba kernels, and what the K-quants' kernels (ggml_kquants) share with them: the instructions they use, the
int8 lanes, Q8_0/Q8_1 activations, float16 rounding.

The same arithmetic as numerics.ggml_numerics (which says what each step is and why), fast: activations quantized
to Q8_0/Q8_1 in Numba, and the products written in LLVM IR, because Numba's loops over int8 come out as
widened 32-bit multiplies at half the speed of its float kernel. One token: per block of 32 weights the IR does
what ggml's x86 code does: unpack to 32 bytes, 8 int32 lanes of 4 byte products (`vpdpbusd` where the CPU has
AVX-512 VNNI, `vpmaddubsw` + `vpmaddwd` with AVX2 only, as ggml's AVX2 code, else the same sums written
target-independently), fma(d_w * d_x, lane, acc) per lane, and at the
end ggml's horizontal sum. A batch: lane tiles, 16 tokens in the 16 lanes of a vector, each word of 4 weight codes
broadcast to every lane, so that one vpdpbusd serves 16 tokens and each token's float steps are its own lane's.
The weights stay in their GGUF bytes (d and m read as float16 in the kernel).
"""

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ..formats.ggml_types import BLOCK_SIZES
from ..formats.ggml_types import GGMLType as QT
from .block_ir import (
    const8,
    e8m0_half,
    e8m0_halves,
    field_at,
    mxfp4_codes,
    nibbles16,
    prefetch_block,
    q5_0_codes,
    row_totals,
    rows_ahead,
)
from .ggml_numerics import GgmlMatrix
from .ir import (
    F32,
    I8,
    I16,
    I32,
    I64,
    V32I8,
    compile_features,
    counted_loop,
    declare,
    lanes,
    load,
    load_f16,
    loop_of,
    prefetch,
    specialize,
    splat,
)
from .quant import N_READ, TILE_T, WIDE, Blocks, part_of, put_tile, row_address, row_quad, to_lanes


def kernel_isa():
    """The integer instructions the kernels use on the CPU Numba compiles for (ir.compile_features): "vnni"
    (256-bit AVX-512 VNNI: vpdpbusd on ymm registers), "avx2" (vpmaddubsw and vpmaddwd, as ggml's AVX2 code) or
    "generic" (target-free IR). Compiling an instruction for a CPU without it aborts the process."""
    features = compile_features()
    if {"avx512vnni", "avx512vl"} <= features:
        return "vnni"
    return "avx2" if "avx2" in features else "generic"


ISA = kernel_isa()
BLOCK_BYTES = {t: BLOCK_SIZES[t][1] for t in (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q8_0, QT.MXFP4)}  # the types with IR
# kernels (MXFP4: its repacked form's only; a matrix llama.cpp multiplies by vec_dot, rows not a multiple of 8, is
# numerics.ggml_x86's)
V8I32, V8F32 = ir.VectorType(I32, 8), ir.VectorType(F32, 8)
V16I32, V16F32 = ir.VectorType(I32, 16), ir.VectorType(F32, 16)
MAGIC = 0x4B400000  # 1.5 * 2^23 as float32 bits: adding an int n (|n| < 2^22) to them gives the bits of 1.5 * 2^23 + n


def _lanes(builder, u, y, isa, scale=None):  # <32 x i8> unsigned, <32 x i8> signed -> <8 x i32>: lane j = sum of 4
    """products (bytes 4j .. 4j + 3), times lane j's scale where given (AVX2: <16 x i16>, lane j's in elements 2j and
    2j + 1; else <8 x i32>). AVX2's vpmaddubsw adds pairs in int16 with saturation: exact here, as every caller's
    unsigned bytes are at most 128 (|code|, 4-, 5- and 6-bit codes) and the signed ones at least -127 (Q8); its
    vpmaddwd then takes the scales in place of ones, as llama.cpp's AVX2 vec_dot does (no 32-bit multiply: the same
    integers)."""
    if isa == "avx2":
        v16i16 = ir.VectorType(I16, 16)
        pairs = builder.call(builder.module.declare_intrinsic("llvm.x86.avx2.pmadd.ub.sw", fnty=ir.FunctionType(
            v16i16, [V32I8, V32I8])), [u, y])
        return builder.call(builder.module.declare_intrinsic("llvm.x86.avx2.pmadd.wd", fnty=ir.FunctionType(
            V8I32, [v16i16, v16i16])), [pairs, ir.Constant(v16i16, [1] * 16) if scale is None else scale])
    if isa == "vnni":
        fn = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.256", fnty=ir.FunctionType(
            V8I32, [V8I32, V8I32, V8I32]))
        dots = builder.call(fn, [ir.Constant(V8I32, None), builder.bitcast(u, V8I32), builder.bitcast(y, V8I32)])
    else:
        v32 = ir.VectorType(I32, 32)
        p = builder.mul(builder.zext(u, v32), builder.sext(y, v32))
        parts = [builder.shuffle_vector(p, ir.Constant(v32, ir.Undefined), ir.Constant(ir.VectorType(I32, 8),
                                                                                      list(range(k, 32, 4))))
                 for k in range(4)]
        dots = builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3]))
    return dots if scale is None else builder.mul(dots, scale)


def _dpbusd16(builder, acc, u, y, isa, pairs_fit=True):  # <16 x i32> + 4 unsigned bytes of u times 4 signed of y,
    """lane by lane. AVX2: vpmaddubsw, which adds pairs of products in int16 with saturation, where `pairs_fit` says
    they stay within it (the callers' small codes); else (a token's codes plus 128 against Q8_0's) both widened to
    int16 and multiplied in pairs in int32 (vpmaddwd), then neighbouring pairs added."""
    if isa == "vnni":
        fn = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.512", fnty=ir.FunctionType(
            V16I32, [V16I32] * 3))
        return builder.call(fn, [acc, u, y])
    v64i8 = ir.VectorType(I8, 64)
    if isa == "avx2" and pairs_fit:
        u8, y8 = builder.bitcast(u, v64i8), builder.bitcast(y, v64i8)
        halves = [_lanes(builder, lanes(builder, u8, 32 * k, 32), lanes(builder, y8, 32 * k, 32), isa) for k in (0, 1)]
        return builder.add(acc, builder.shuffle_vector(*halves, ir.Constant(V16I32, list(range(16)))))
    if isa == "avx2":
        v16i16, v64i16 = ir.VectorType(I16, 16), ir.VectorType(I16, 64)
        a = builder.zext(builder.bitcast(u, v64i8), v64i16)
        b = builder.sext(builder.bitcast(y, v64i8), v64i16)
        madd = builder.module.declare_intrinsic("llvm.x86.avx2.pmadd.wd", fnty=ir.FunctionType(
            V8I32, [v16i16, v16i16]))
        pairs = [builder.call(madd, [lanes(builder, a, 16 * k, 16), lanes(builder, b, 16 * k, 16)]) for k in range(4)]
        pairs = [builder.shuffle_vector(pairs[k], pairs[k + 1], ir.Constant(V16I32, list(range(16))))
                 for k in (0, 2)]
        whole = builder.shuffle_vector(pairs[0], pairs[1], ir.Constant(ir.VectorType(I32, 32), list(range(32))))
        even, odd = (builder.shuffle_vector(whole, whole, ir.Constant(V16I32, list(range(k, 32, 2)))) for k in (0, 1))
        return builder.add(acc, builder.add(even, odd))
    v64 = ir.VectorType(I32, 64)
    p = builder.mul(builder.zext(builder.bitcast(u, v64i8), v64), builder.sext(builder.bitcast(y, v64i8), v64))
    parts = [builder.shuffle_vector(p, p, ir.Constant(V16I32, list(range(k, 64, 4)))) for k in range(4)]
    return builder.add(acc, builder.add(builder.add(parts[0], parts[1]), builder.add(parts[2], parts[3])))


V4F32, V4I32 = ir.VectorType(F32, 4), ir.VectorType(I32, 4)


def _block_scales(builder, blks, qtype):  # 4 rows' blocks -> <4 x float>: each block's scale, as _block_scale's
    if qtype != QT.MXFP4:
        v = ir.Constant(ir.VectorType(ir.HalfType(), 4), None)
        for r, blk in enumerate(blks):
            h = builder.bitcast(load(builder, field_at(builder, blk, qtype, "d"), I16), ir.HalfType())
            v = builder.insert_element(v, h, ir.Constant(I32, r))
        return builder.fpext(v, V4F32)
    e = ir.Constant(V4I32, None)
    for r, blk in enumerate(blks):
        e = builder.insert_element(e, builder.zext(load(builder, field_at(builder, blk, qtype, "e"), I8), I32),
                                   ir.Constant(I32, r))
    return e8m0_halves(builder, e)


def _row_totals(builder, rows):  # 4 x <8 x i32> -> <4 x i32>: lane r the sum of rows[r]'s lanes (exact integers)
    assert len(rows) == 4
    halves = [builder.add(lanes(builder, v, 0, 4), lanes(builder, v, 4, 4)) for v in rows]  # 4 x <4 x i32>

    def pairs(a, b):  # [a0 + a1, a2 + a3, b0 + b1, b2 + b3]
        even, odd = (ir.Constant(ir.VectorType(I32, 4), [k, k + 2, k + 4, k + 6]) for k in (0, 1))
        return builder.add(builder.shuffle_vector(a, b, even), builder.shuffle_vector(a, b, odd))

    return pairs(pairs(halves[0], halves[1]), pairs(halves[2], halves[3]))


def _mxfp4_fours(builder, ws, x, xd, xs, g, ahead, acc, fma4):
    """The repacked MXFP4 gemv's blocks 4g .. 4g + 3 of the N_READ rows at ws, in 512-bit registers: acc (<4 x
    float>, a row a lane) after their 4 float steps, fma(isum, d_w * d_x, acc) a block in order, over the same exact
    integers as a block at a time. A row's 4 blocks are 68 bytes: two loads (at 0 and 4) hold them, one byte
    permute (vpermt2b) gathers their 64 bytes of codes and a shuffle their 4 scales; x's 4 blocks of 32 come paired
    to the nibbles (values 0-15 of each block with the low ones) and their offsets' products in xs (_fours_of, once
    a token); each nibble's value is looked up (vpshufb) and two vpdpbusd sum a row's 4 blocks, 4 lanes a block,
    where a block at a time takes a vpdpbusd on half a register."""
    v64i8, size, n_rows = ir.VectorType(I8, 64), BLOCK_BYTES[QT.MXFP4], N_READ
    base = builder.mul(g, ir.Constant(I64, 4 * size))
    x_low, x_high = (load(builder, builder.add(x, builder.add(builder.mul(g, ir.Constant(I64, 128)), ir.Constant(
        I64, 64 * h))), V16I32) for h in (0, 1))  # _fours_of's order: blocks' values 0-15, then 16-31
    permute = builder.module.declare_intrinsic("llvm.x86.avx512.vpermi2var.qi.512", fnty=ir.FunctionType(
        v64i8, [v64i8] * 3))
    lookup = builder.module.declare_intrinsic("llvm.x86.avx512.pshuf.b.512", fnty=ir.FunctionType(v64i8, [v64i8] * 2))
    dpbusd = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.512", fnty=ir.FunctionType(
        V16I32, [V16I32] * 3))
    table, low4 = ir.Constant(v64i8, KVALUES_PLUS_12 * 4), ir.Constant(v64i8, [15] * 64)
    # the codes of block b: bytes 17 b + 1 .. 17 b + 16, from the load at 0 (below 64) or the one at 4 (64 + j - 4)
    at = ir.Constant(v64i8, [j if j < 64 else 64 + j - 4 for b in range(4) for j in range(17 * b + 1, 17 * b + 17)])
    dots, firsts = [], []
    for r in range(n_rows):
        blk = builder.add(builder.extract_value(ws, r), base)
        for line in (0, 64):
            prefetch(builder, builder.add(blk, builder.add(ahead, ir.Constant(I64, line))))
        first, last = (load(builder, builder.add(blk, ir.Constant(I64, o)), v64i8) for o in (0, 4))
        qs = builder.call(permute, [first, at, last])
        nibbles = builder.and_(qs, low4), builder.and_(builder.lshr(qs, ir.Constant(v64i8, [4] * 64)), low4)
        v = ir.Constant(V16I32, None)
        for n, y in zip(nibbles, (x_low, x_high), strict=True):
            v = builder.call(dpbusd, [v, builder.bitcast(builder.call(lookup, [table, n]), V16I32), y])
        dots.append(v)  # block b in lanes 4b .. 4b + 3
        firsts.append(first)
    # -> lane 4r + b: row r's block b; less the codes' offset times x's sum over block b (_fours_of's)
    isums = row_totals(builder, dots, 4 * n_rows)
    offsets = load(builder, builder.add(xs, builder.mul(g, ir.Constant(I64, 16))), V4I32)
    isums = builder.sub(isums, builder.shuffle_vector(offsets, offsets, ir.Constant(V16I32, [
        b for _ in range(n_rows) for b in range(4)])))
    e = builder.zext(builder.shuffle_vector(*[builder.shuffle_vector(firsts[k], firsts[k + 1], ir.Constant(
        ir.VectorType(I32, 8), [64 * h + 17 * b for h in (0, 1) for b in range(4)])) for k in (0, 2)],
        ir.Constant(V16I32, list(range(16)))), V16I32)  # lane 4r + b: row r's block b's exponent
    scales = e8m0_halves(builder, e)
    dx = load(builder, builder.add(xd, builder.mul(g, ir.Constant(I64, 16))), V4F32)
    ds = builder.fmul(scales, builder.shuffle_vector(dx, dx, ir.Constant(V16I32, [b for _ in range(n_rows)
                                                                                   for b in range(4)])))
    isums = builder.sitofp(isums, V16F32)
    acc = acc[0]
    for b in range(4):  # block b of every row: lanes b, 4 + b, ..
        pick = ir.Constant(ir.VectorType(I32, n_rows), [4 * r + b for r in range(n_rows)])
        acc = builder.call(fma4, [builder.shuffle_vector(isums, isums, pick), builder.shuffle_vector(ds, ds, pick),
                                  acc])
    return [acc]


def _mxfp4_fours_avx2(builder, ws, x, xd, xs, g, ahead, acc, fma4):
    """_mxfp4_fours in 256-bit registers: the same x (_fours_of's), blocks two at a time. A row's two blocks' codes
    in one register (two 16-byte loads), each nibble's value looked up (vpshufb), the low and the high nibbles'
    products with x in pairs (vpmaddubsw: at most 24 * 127 * 2 a pair, and two pairs' sum within int16) added,
    then in 8 int32 lanes (vpmaddwd), 4 a block; three vphaddd take the 4 rows' lanes to one lane a row and block,
    block-major in the register's halves: each block's float step takes a half as it is."""
    v32i8, v16i16, size = ir.VectorType(I8, 32), ir.VectorType(I16, 16), BLOCK_BYTES[QT.MXFP4]
    v16i8 = ir.VectorType(I8, 16)
    base = builder.mul(g, ir.Constant(I64, 4 * size))

    lookup = declare(builder, "llvm.x86.avx2.pshuf.b", v32i8, v32i8, v32i8)
    maddubs = declare(builder, "llvm.x86.avx2.pmadd.ub.sw", v16i16, v32i8, v32i8)
    madd = declare(builder, "llvm.x86.avx2.pmadd.wd", V8I32, v16i16, v16i16)
    hadd = declare(builder, "llvm.x86.avx2.phadd.d", V8I32, V8I32, V8I32)
    table, low4 = ir.Constant(v32i8, KVALUES_PLUS_12 * 2), ir.Constant(v32i8, [15] * 32)
    ones = ir.Constant(v16i16, [1] * 16)
    xg = builder.add(x, builder.mul(g, ir.Constant(I64, 128)))
    offsets = load(builder, builder.add(xs, builder.mul(g, ir.Constant(I64, 16))), V4I32)
    dx = load(builder, builder.add(xd, builder.mul(g, ir.Constant(I64, 16))), V4F32)
    blks = [builder.add(builder.extract_value(ws, r), base) for r in range(N_READ)]
    for blk in blks:
        for line in (0, 64):
            prefetch(builder, builder.add(blk, builder.add(ahead, ir.Constant(I64, line))))
    acc = acc[0]
    for pair in (0, 1):  # blocks 2 pair and 2 pair + 1
        y_low, y_high = (load(builder, builder.add(xg, ir.Constant(I64, 32 * pair + 64 * h)), v32i8) for h in (0, 1))
        dots = []
        for blk in blks:
            halves = [load(builder, builder.add(blk, ir.Constant(I64, size * (2 * pair + b) + 1)), v16i8)
                      for b in (0, 1)]
            qs = builder.shuffle_vector(*halves, ir.Constant(ir.VectorType(I32, 32), list(range(32))))
            low, high = builder.and_(qs, low4), builder.and_(builder.lshr(qs, ir.Constant(v32i8, [4] * 32)), low4)
            pairs = builder.add(*[builder.call(maddubs, [builder.call(lookup, [table, n]), y])
                                  for n, y in ((low, y_low), (high, y_high))])
            dots.append(builder.call(madd, [pairs, ones]))  # block 2 pair in lanes 0-3, the next in 4-7
        # lanes 0-3: rows 0-3's first block, 4-7 their second (vphaddd adds within each 128-bit half)
        isums = builder.call(hadd, [builder.call(hadd, dots[:2]), builder.call(hadd, dots[2:])])
        order = [2 * pair + b for b in (0, 1) for _ in range(N_READ)]
        isums = builder.sub(isums, builder.shuffle_vector(offsets, offsets, ir.Constant(V8I32, order)))
        e = ir.Constant(V8I32, ir.Undefined)  # the exponents, rows 0-3's of the first block, then of the second
        for k, (b, r) in enumerate((b, r) for b in (0, 1) for r in range(N_READ)):
            at = builder.add(blks[r], ir.Constant(I64, size * (2 * pair + b)))
            e = builder.insert_element(e, builder.zext(load(builder, at, I8), I32), ir.Constant(I32, k))
        ds = builder.fmul(e8m0_halves(builder, e), builder.shuffle_vector(dx, dx, ir.Constant(V8I32, order)))
        isums = builder.sitofp(isums, V8F32)
        for b in (0, 1):
            acc = builder.call(fma4, [lanes(builder, isums, 4 * b, 4), lanes(builder, ds, 4 * b, 4), acc])
    return [acc]


def in_pairs(qtype, isa, repacked):  # whether one token's vec_dot rows go 2 blocks at a time (_block_pairs)
    return qtype in (QT.Q8_0, QT.Q5_0) and isa == "vnni" and not repacked and WIDE


def _block_pairs(builder, qtype, ws, x, xd, g, ahead, sums, fma8):
    """ggml_vec_dot's blocks 2g and 2g + 1 of the N_READ rows at ws (Q8_0, Q5_0), in 512-bit registers: a row's
    two blocks' codes in one vector against x's 64 codes, one vpdpbusd for both blocks' 8 lanes (Q8_0 by ggml's sign
    trick, Q5_0's codes plus 16 with the offset's products taken off once for every row), then each block's float
    step into the row's 8 lanes in order, fma(d_w * d_x, lane, acc): the sums and steps of a block at a time."""
    v64i8, size = ir.VectorType(I8, 64), BLOCK_BYTES[qtype]
    dpbusd = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.512", fnty=ir.FunctionType(
        V16I32, [V16I32] * 3))
    zero, zero8 = ir.Constant(V16I32, None), ir.Constant(v64i8, None)
    y = load(builder, builder.add(x, builder.mul(g, ir.Constant(I64, 64))), v64i8)
    offset = None
    if qtype in OFFSET:
        offset = builder.call(dpbusd, [zero, ir.Constant(V16I32, [OFFSET[qtype] * 0x01010101] * 16),
                                       builder.bitcast(y, V16I32)])
    dxs = [load(builder, builder.add(xd, builder.mul(builder.add(builder.mul(g, ir.Constant(I64, 2)), ir.Constant(
        I64, k)), ir.Constant(I64, 4))), F32) for k in (0, 1)]
    out = list(sums)
    for r in range(N_READ):
        blks = [builder.add(builder.extract_value(ws, r), builder.mul(builder.add(builder.mul(g, ir.Constant(I64, 2)),
                                                                                ir.Constant(I64, k)), ir.Constant(
            I64, size))) for k in (0, 1)]
        for blk in blks:
            prefetch_block(builder, blk, qtype, ahead)
        codes = [q5_0_codes(builder, blk, signed=False) if qtype == QT.Q5_0 else
                 load(builder, field_at(builder, blk, qtype, "qs"), V32I8) for blk in blks]
        u = builder.shuffle_vector(*codes, ir.Constant(ir.VectorType(I32, 64), list(range(64))))
        yr = y
        if qtype == QT.Q8_0:  # |w| times y with w's sign (w = 0: |w| is 0)
            neg = builder.icmp_signed("<", u, zero8)
            u, yr = builder.select(neg, builder.sub(zero8, u), u), builder.select(neg, builder.sub(zero8, y), y)
        dots = builder.call(dpbusd, [zero, builder.bitcast(u, V16I32), builder.bitcast(yr, V16I32)])
        if offset is not None:
            dots = builder.sub(dots, offset)
        lanes16 = builder.sitofp(dots, V16F32)
        acc = out[2 * r]
        for k, blk in enumerate(blks):  # d_w * d_x, then the block's 8 lanes
            d = builder.fmul(_block_scale(builder, blk, qtype), dxs[k])
            acc = builder.call(fma8, [splat(builder, d, V8F32), lanes(builder, lanes16, 8 * k, 8), acc])
        out[2 * r] = acc
    return out


def _make_dot(qtype, isa, repacked):
    """An intrinsic (ws, x, xd, xs, nb) -> N_READ floats: one token's dot products with the rows at addresses ws,
    nb blocks each, read side by side; x: the token's Q8 codes, xd, xs: its d and s (float32) per block (MXFP4's
    four blocks at a time: _fours_of's x and offsets). Per
    block ggml_vec_dot's 8 int32 lanes, fma(d_w * d_x, lane, acc) into 8 float32 lanes, hsum_float_8 at the end
    (Q4_1: plus the m_w * s_x sums); `repacked` (Q4_0): x86's repacked gemv, one fma(isum, d_w * d_x, acc) a
    block."""
    fma8_type, fma1_type = ir.FunctionType(V8F32, [V8F32] * 3), ir.FunctionType(F32, [F32] * 3)

    def codegen(context, builder, signature, args):
        ws, x, xd, xs, nb = args
        ahead = rows_ahead(builder, builder.mul(nb, ir.Constant(I64, BLOCK_BYTES[qtype])), N_READ)
        fma8 = builder.module.declare_intrinsic("llvm.fma.v8f32", fnty=fma8_type)
        fma1 = builder.module.declare_intrinsic("llvm.fma.f32", fnty=fma1_type)
        zero = ir.Constant(V32I8, None)

        def row_block(w, i, y, offset, acc, summs):  # one row's block i added to its sums and its Q4_1 offset sums
            blk = builder.add(w, builder.mul(i, ir.Constant(I64, BLOCK_BYTES[qtype])))
            prefetch_block(builder, blk, qtype, ahead)
            if qtype == QT.Q8_0:  # ggml's sign trick: |w| (unsigned) times y with w's sign
                q = _signed_codes(builder, blk, qtype)
                neg = builder.icmp_signed("<", q, zero)
                u = builder.select(neg, builder.sub(zero, q), q)
                is_zero = builder.icmp_signed("==", q, zero)
                y = builder.select(neg, builder.sub(zero, y), builder.select(is_zero, zero, y))
            elif qtype == QT.MXFP4:  # its codes plus OFFSET[MXFP4] (unsigned), the offset's products taken off below
                u = _mxfp4_unsigned(builder, blk, isa)
            elif qtype == QT.Q5_0:  # its codes plus 16, as Q4_0's plus 8: a lane's integer as the sign trick's
                u = q5_0_codes(builder, blk, signed=False)
            else:  # 4-bit codes: byte j holds value j (low nibble) and value j + 16 (high)
                u = nibbles16(builder, field_at(builder, blk, qtype, "qs"))
            dots = _lanes(builder, u, y, isa)
            if repacked:  # the block's exact sum (the offset's products not yet taken off) and its address:
                return dots, blk  # block() takes the rest for every row at once
            at = builder.mul(i, ir.Constant(I64, 4))
            d = builder.fmul(_block_scale(builder, blk, qtype), load(builder, builder.add(xd, at), F32))  # d_w * d_x
            if qtype == QT.Q4_1:
                summs = builder.call(fma1, [load_f16(builder, field_at(builder, blk, qtype, "m")),
                                            load(builder, builder.add(xs, at), F32), summs])
            if offset is not None:  # (code - c) * y = code * y - c * y, lane by lane
                dots = builder.sub(dots, offset)
            return builder.call(fma8, [splat(builder, d, V8F32), builder.sitofp(dots, V8F32), acc]), summs

        def block(i, sums):  # every row's block i: sums holds each row's sum and then its offset sum (repacked:
            # one vector of the rows' sums)
            y = load(builder, builder.add(x, builder.mul(i, ir.Constant(I64, 32))), V32I8)
            offset = _lanes(builder, const8(OFFSET[qtype]), y, isa) if qtype in OFFSET else None  # the rows' alike
            if repacked:  # fma(isum, d_w * d_x, acc) of the N_READ rows in the lanes of one vector
                parts = [row_block(builder.extract_value(ws, r), i, y, offset, None, None) for r in range(N_READ)]
                isums = _row_totals(builder, [dots for dots, _ in parts])
                if offset is not None:  # (code - c) * y summed: the code's products less c times y's sum
                    isums = builder.sub(isums, splat(builder, builder.call(reduce8, [offset]), V4I32))
                dx = load(builder, builder.add(xd, builder.mul(i, ir.Constant(I64, 4))), F32)
                ds = builder.fmul(_block_scales(builder, [blk for _, blk in parts], qtype), splat(builder, dx, V4F32))
                return [builder.call(fma4, [builder.sitofp(isums, V4F32), ds, sums[0]])]
            return [v for r in range(N_READ)
                    for v in row_block(builder.extract_value(ws, r), i, y, offset, sums[2 * r], sums[2 * r + 1])]

        if repacked:
            fma4 = builder.module.declare_intrinsic("llvm.fma.v4f32", fnty=ir.FunctionType(V4F32, [V4F32] * 3))
            reduce8 = builder.module.declare_intrinsic("llvm.vector.reduce.add.v8i32",
                                                       fnty=ir.FunctionType(I32, [V8I32]))
            acc, done = [ir.Constant(V4F32, None)], ir.Constant(I64, 0)
            if fours(qtype, isa, repacked):  # 4 blocks at a time, the last nb % 4 one by one
                n4 = builder.udiv(nb, ir.Constant(I64, 4))
                four = _mxfp4_fours if isa == "vnni" else _mxfp4_fours_avx2
                acc = loop_of(builder, n4, acc, lambda g, a: four(builder, ws, x, xd, xs, g, ahead, a, fma4))
                done = builder.mul(n4, ir.Constant(I64, 4))
            acc = loop_of(builder, builder.sub(nb, done), acc, lambda i, a: block(builder.add(i, done), a))[0]
            results = [builder.extract_element(acc, ir.Constant(I32, r)) for r in range(N_READ)]
            return context.make_tuple(builder, signature.return_type, results)
        sums, done = [ir.Constant(V8F32, None), ir.Constant(F32, 0.0)] * N_READ, ir.Constant(I64, 0)
        if in_pairs(qtype, isa, repacked):  # 2 blocks at a time, the last nb % 2 alone
            n2 = builder.udiv(nb, ir.Constant(I64, 2))
            sums = loop_of(builder, n2, sums, lambda g, s: _block_pairs(builder, qtype, ws, x, xd, g, ahead, s, fma8))
            done = builder.mul(n2, ir.Constant(I64, 2))
        sums = loop_of(builder, builder.sub(nb, done), sums, lambda i, s: block(builder.add(i, done), s))
        results = []
        for r in range(N_READ):
            acc, summs = sums[2 * r], sums[2 * r + 1]
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


BLOCK_TILE_N = {False: 2, True: 4}  # rows a block tile multiplies at once: 8 float32 sums a row (4 if repacked: one)


def _signed_codes(builder, blk, qtype):  # a Q4_0/Q4_1/Q5_0/Q8_0/MXFP4 block -> <32 x i8>: the integers ggml
    if qtype == QT.Q8_0:  # multiplies
        return load(builder, field_at(builder, blk, qtype, "qs"), V32I8)
    if qtype == QT.Q5_0:
        return q5_0_codes(builder, blk)
    if qtype == QT.MXFP4:
        return mxfp4_codes(builder, blk)
    codes = nibbles16(builder, field_at(builder, blk, qtype, "qs"))
    return builder.sub(codes, const8(8)) if qtype == QT.Q4_0 else codes


OFFSET = {QT.Q4_0: 8, QT.Q5_0: 16, QT.MXFP4: 12}  # what the one-token kernel adds to codes to make them unsigned
MXFP4_OFFSET = OFFSET[QT.MXFP4]
KVALUES_PLUS_12 = [12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0]  # ggml_tables.KVALUES_MXFP4 + 12


def _mxfp4_unsigned(builder, blk, isa):  # an MXFP4 block -> <32 x i8>: its codes + 12, 0 .. 24
    """A table lookup of each nibble (vpshufb, as ggml's x86 code looks its values up) where the CPU has AVX2."""
    if isa == "generic":
        return builder.add(mxfp4_codes(builder, blk), const8(12))
    shuffle = builder.module.declare_intrinsic("llvm.x86.avx2.pshuf.b", fnty=ir.FunctionType(V32I8, [V32I8] * 2))
    return builder.call(shuffle, [ir.Constant(V32I8, KVALUES_PLUS_12 * 2),
                                  nibbles16(builder, field_at(builder, blk, QT.MXFP4, "qs"))])


def _block_scale(builder, blk, qtype):  # a block's float scale: its float16 d, or MXFP4's half E8M0
    return e8m0_half(builder, blk) if qtype == QT.MXFP4 else load_f16(builder, field_at(builder, blk, qtype, "d"))


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
            sums = _lanes(builder, const8(1), codes, "generic")  # each word's sum
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


def _make_block_tile(qtype, isa, repacked):
    """An intrinsic (ws, codes, pitch, xt, dt, st, nb, out): BLOCK_TILE_N[repacked] rows, their blocks of 32 at
    addresses ws (for d and m) unpacked by _make_block_codes at codes, codes + pitch, .., against TILE_T tokens in
    the lanes of a vector, as _make_dot computes each token's: xt, the tokens' Q8 codes plus 128, 4 at a time
    ([K/4, TILE_T] words); dt, st: their Q8 d and s ([K/32, TILE_T] float32); out: [rows, TILE_T] float32. Each word
    of a row's codes is broadcast from memory to every lane, and one vpdpbusd adds its 4 products with every
    token's: ggml's 8 int32 lanes of a block (lane j: elements 4j .. 4j + 3) are 8 vectors here, each with its own
    float32 sums (vec_dot's 8 lanes, hsum_float_8 at the end; `repacked`: one sum a block). Not repacked, each sum
    starts from MAGIC, so that its float32 value is its bits minus 1.5 * 2^23."""
    size, n_rows = BLOCK_BYTES[qtype], BLOCK_TILE_N[repacked]
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
                ds.append(builder.fmul(splat(builder, _block_scale(builder, blk, qtype), V16F32), dx))  # d_w * d_x
                if qtype == QT.Q4_1:  # m_w * s_x, summed apart
                    m = splat(builder, load_f16(builder, field_at(builder, blk, qtype, "m")), V16F32)
                    accs[r * (per + 1) + per] = builder.call(fma, [m, vec(st, i, V16F32), accs[r * (per + 1) + per]])
            for j in range(8):
                at = builder.add(builder.mul(i, ir.Constant(I64, 8)), ir.Constant(I64, j))
                y = vec(xt, at)
                for r in range(n_rows):
                    lanes = _dpbusd16(builder, word(r, at, K), y, word(r, at, ir.Constant(I64, 0)), isa,
                                      qtype != QT.Q8_0)  # 4- and 5-bit codes: pairs within int16
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


# one type's intrinsics (a token's N_READ rows; a row's codes unpacked; a block tile), sizes, the starts' MAGIC,
# whether a token's rows go 4 blocks at a time (_mxfp4_fours), the most tokens that go one at a time
DOTS = CODES = BTILE = ROW_BYTES = N_ROWS = BIAS = FOURS = FEW = None


# the most tokens a product takes one at a time (each row quad read once for all of them), by type and CPU path:
# on AVX2 a block tile costs alike for 1 to 16 tokens, and Q8_0's (its codes against x + 128, widened to int16)
# more than a token at a time at every batch (docs/performance.md); not named, one token
FEW_TOKENS = {(QT.Q4_0, "avx2"): 8, (QT.Q4_1, "avx2"): 8, (QT.Q5_0, "avx2"): 12, (QT.MXFP4, "avx2"): 6,
              (QT.Q8_0, "avx2"): 1 << 30}


def fours(qtype, isa, repacked):
    return qtype == QT.MXFP4 and repacked and (isa == "vnni" and WIDE or isa == "avx2")


@njit(cache=True)
def _fours_of(xq):  # [P, K] i8 -> [P, K] i8, [P, K/32] i32: _mxfp4_fours' x, block by block
    """Each 4 blocks' 128 codes in the nibbles' order (each block's values 0-15, then each block's 16-31), and each
    block's codes' sum times OFFSET[MXFP4] (the codes' offset); the last K/32 % 4 blocks as they are."""
    P, K = xq.shape
    nb = K // 32
    paired, offsets = xq.copy(), np.zeros((P, nb), np.int32)
    for p in range(P):
        for b in range(nb):
            total = 0
            for j in range(32):
                total += xq[p, 32 * b + j]
            offsets[p, b] = MXFP4_OFFSET * total
        for g in range(nb // 4):
            for b in range(4):
                for j in range(16):
                    paired[p, 128 * g + 16 * b + j] = xq[p, 128 * g + 32 * b + j]
                    paired[p, 128 * g + 64 + 16 * b + j] = xq[p, 128 * g + 32 * b + 16 + j]
    return paired, offsets


def _matmul(X, bases, starts, per_part):  # [T, K] f32, the parts' addresses and first rows -> [T, N] f32
    """Or (`per_part`) -> [1, N]: part p's rows times X[p], each as one token's product (one token's experts,
    parts of whole quads). Up to FEW tokens go one at a time, each row quad read once for all of them; more, TILE_T
    at a time in the lanes of the block tiles. A token's products are the same floats either way."""
    T, K = X.shape
    N, nb = starts[-1], K // 32
    xq = np.empty((T, K), np.int8)
    xd = np.empty((nb, T), np.float32)  # block by block, the tokens side by side
    xs = np.empty((nb, T), np.float32)
    quantize_q8(X, xq, xd, xs)
    if per_part or T <= FEW:
        dr, sr = np.ascontiguousarray(xd.T), np.ascontiguousarray(xs.T)  # [T, nb]: a token's d and s together
        n_out = 1 if per_part else T
        out = np.empty((n_out, N), np.float32)
        # _mxfp4_fours': x in its order, and (in xs' place: MXFP4 has no s) its offsets' products
        xw, offsets = _fours_of(xq) if FOURS else (xq, np.zeros((1, 1), np.int32))
        n_quads = (N + N_READ - 1) // N_READ
        n_chunks = min(n_quads, 64)
        for c in prange(n_chunks):
            # addresses taken here, inside the loop: the arrays are then the loop's own arguments, kept alive by it
            # (taken before it, Numba may free xq once its last named use has passed)
            x0, d0, s0 = xw.ctypes.data, dr.ctypes.data, offsets.ctypes.data if FOURS else sr.ctypes.data
            for q in range(c * n_quads // n_chunks, (c + 1) * n_quads // n_chunks):
                quad = row_quad(bases, starts, q, N, nb * ROW_BYTES)
                for t in range(n_out):
                    p = part_of(starts, N_READ * q) if per_part else t
                    sums = DOTS(quad, x0 + p * K, d0 + p * nb * 4, s0 + p * nb * 4, nb)
                    for i in range(N_READ):
                        out[t, min(N_READ * q + i, N - 1)] = sums[i]
        return out
    out = np.empty((T, N), np.float32)
    n_tiles = (T + TILE_T - 1) // TILE_T
    # the tokens in lanes: x's codes plus 128 (each byte's sign bit flipped: 0x80808080), their d and s
    xt, dt, st = to_lanes(xq.view(np.int32) ^ np.int32(-0x7F7F7F80), n_tiles), to_lanes(xd.T, n_tiles), \
        to_lanes(xs.T, n_tiles)
    n_groups = (N + N_ROWS - 1) // N_ROWS
    n_chunks = min(n_groups, 64)
    pitch = 2 * K + 64  # a row's codes and starts, then a line more (rows 4 KiB apart would share cache sets)
    for c in prange(n_chunks):
        res = np.empty((N_ROWS, TILE_T), np.float32)
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
                put_tile(out, res, j * TILE_T, n0, rows, min(TILE_T, T - j * TILE_T))
    return out


def _make_matmul(qtype, isa, repacked):
    """_matmul with one type's and form's intrinsics as its globals."""
    name = f"matmul_{qtype.name}{'_repacked' if repacked else ''}_{isa}"
    return specialize(_matmul, name, DOTS=_make_dot(qtype, isa, repacked), CODES=_make_block_codes(qtype),
                      BTILE=_make_block_tile(qtype, isa, repacked), ROW_BYTES=BLOCK_BYTES[qtype],
                      N_ROWS=BLOCK_TILE_N[repacked], BIAS=0 if repacked else MAGIC, FOURS=fours(qtype, isa, repacked),
                      FEW=FEW_TOKENS.get((qtype, isa), 1))


KERNELS = {}  # (qtype, isa, repacked) -> compiled matmul, made on first use


def kernel(qtype, isa=ISA, repacked=False):
    if (qtype, isa, repacked) not in KERNELS:
        KERNELS[qtype, isa, repacked] = _make_matmul(qtype, isa, repacked)
    return KERNELS[qtype, isa, repacked]


class GgmlBlocks(Blocks):
    """A matrix in its GGUF blocks, in place, for numerics ggml: rows dequantize as GgmlMatrix's (llama.cpp's
    get_rows); `isa` picks the kernels' form."""

    isa = ISA

    def __getitem__(self, rows):
        rows = self.row_ids(rows)
        return GgmlMatrix(self.raw_rows(rows), self.qtype, (len(rows), self.shape[1]))[np.arange(len(rows))]


class NumbaGgmlMatrix(GgmlBlocks):
    """A Q4_0/Q4_1/Q5_0/Q8_0 matrix: `x @ w.T` runs the IR kernel."""

    def matmul(self, x):  # [T, K] -> [T, N]
        return kernel(self.qtype, self.isa, self.repacked)(np.ascontiguousarray(x, dtype=np.float32), self.bases,
                                                            self.starts, False)

    def matmul_parts(self, X):  # [P, K] -> [1, N]: part p's rows times X[p], each as one token's product
        return kernel(self.qtype, self.isa, self.repacked)(np.ascontiguousarray(X, dtype=np.float32), self.bases,
                                                            self.starts, True)
