"""GGUF blocks read in place, in LLVM IR: each type's values as groups of 32 (codes, scale, offset), the unpacking that
the float32 kernels (quant) and ggml's integer kernels (ggml_kernels) share. The layouts are ggml_tables.LAYOUT's; the
order of values within a block is ggml's dequantize_row_* (ggml-quants.c)."""

from llvmlite import ir

from ..formats.ggml_types import BLOCK_SIZES
from ..formats.ggml_types import GGMLType as QT
from .ggml_tables import LAYOUT
from .ir import F32, I8, I32, I64, V32F32, V32I8, load, load_f16, prefetch, splat

V16I8 = ir.VectorType(I8, 16)
AHEAD = 1024  # bytes: how far ahead of the block in use its row's stream is prefetched (one thread's row, in order)
GROUPS = {QT.Q4_0: 1, QT.Q4_1: 1, QT.Q5_0: 1, QT.Q8_0: 1, QT.Q4_K: 8, QT.Q5_K: 8, QT.Q6_K: 8}  # 32s per block


def field_at(builder, blk, qtype, name, plus=0):  # the address of a field of the block at blk, plus `plus` bytes
    return builder.add(blk, ir.Constant(I64, LAYOUT[qtype][name][0] + plus))


def const8(value):
    return ir.Constant(V32I8, [value] * 32)


def nibbles16(builder, addr):  # 16 bytes -> <32 x i8>: byte j's low nibble in lane j, its high one in lane j + 16
    qs = load(builder, addr, V16I8)
    return builder.shuffle_vector(builder.and_(qs, ir.Constant(V16I8, [15] * 16)),
                                  builder.lshr(qs, ir.Constant(V16I8, [4] * 16)),
                                  ir.Constant(ir.VectorType(I32, 32), list(range(32))))


def nibbles32(builder, addr, high):  # 32 bytes -> <32 x i8>: their low (high=False) or high nibbles
    qs = load(builder, addr, V32I8)
    return builder.lshr(qs, const8(4)) if high else builder.and_(qs, const8(15))


def bits32(builder, addr, shift, width):  # 32 bytes -> <32 x i8>: bits shift .. shift + width - 1 of each
    return builder.and_(builder.lshr(load(builder, addr, V32I8), const8(shift)), const8((1 << width) - 1))


def q5_0_codes(builder, blk):  # a Q5_0 block -> <32 x i8> its signed codes: nibble | fifth bit << 4, minus 16
    v32 = ir.VectorType(I32, 32)
    bits = builder.lshr(splat(builder, load(builder, field_at(builder, blk, QT.Q5_0, "qh"), I32), v32),
                        ir.Constant(v32, list(range(32))))  # bit j of qh is value j's fifth bit
    high = builder.shl(builder.trunc(builder.and_(bits, ir.Constant(v32, [1] * 32)), V32I8), const8(4))
    codes = builder.or_(nibbles16(builder, field_at(builder, blk, QT.Q5_0, "qs")), high)
    return builder.sub(codes, const8(16))


def k_scale_min(builder, blk, qtype, j):
    """Q4_K/Q5_K: sub-block j's 6-bit scale and min (get_scale_min_k4) as i32: 8 of each packed in 12 bytes."""
    def q(i):
        return builder.zext(load(builder, field_at(builder, blk, qtype, "scales", i), I8), I32)

    def c(v):
        return ir.Constant(I32, v)

    if j < 4:
        return builder.and_(q(j), c(63)), builder.and_(q(j + 4), c(63))
    top = builder.lshr(q(j - 4), c(6)), builder.lshr(q(j), c(6))  # the scale's and the min's two high bits
    sc = builder.or_(builder.and_(q(j + 4), c(15)), builder.shl(top[0], c(4)))
    return sc, builder.or_(builder.lshr(q(j + 4), c(4)), builder.shl(top[1], c(4)))


def q6_k_codes(builder, blk, c):
    """Q6_K's values 32c .. 32c + 31 as <32 x i8>, 0..63 (the signed code is this minus 32): of each 128 values,
    the quarter i takes ql's low nibbles (i = 0, 1) or high ones (2, 3) of bytes 32 (i % 2) .., and bits 2i, 2i + 1
    of qh."""
    h, i = divmod(c, 4)
    low = nibbles32(builder, field_at(builder, blk, QT.Q6_K, "ql", 64 * h + 32 * (i % 2)), i >= 2)
    high = bits32(builder, field_at(builder, blk, QT.Q6_K, "qh", 32 * h), 2 * i, 2)
    return builder.or_(low, builder.shl(high, const8(4)))


def k_codes(builder, blk, qtype, j):  # Q4_K/Q5_K: sub-block j's 32 codes (0..15 or 0..31) as <32 x i8>
    low = nibbles32(builder, field_at(builder, blk, qtype, "qs", 32 * (j // 2)), j % 2 == 1)
    if qtype == QT.Q4_K:
        return low
    return builder.or_(low, builder.shl(bits32(builder, field_at(builder, blk, qtype, "qh"), j, 1), const8(4)))


def groups(builder, qtype, blk):
    """IR of the block at blk, a group of 32 values at a time: a list of (codes <32 x float>, scale <32 x float>,
    offset float or None), value = scale * code (+ offset), each product as ggml's dequantize_row_* takes it
    (d * sc of the K-quants is exact in float32, as is -8 d of Q4_0)."""
    if qtype in (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q8_0):
        d = load_f16(builder, field_at(builder, blk, qtype, "d"))
        if qtype == QT.Q8_0:
            return [(builder.sitofp(load(builder, field_at(builder, blk, qtype, "qs"), V32I8), V32F32),
                     splat(builder, d, V32F32), None)]
        if qtype == QT.Q5_0:
            return [(builder.sitofp(q5_0_codes(builder, blk), V32F32), splat(builder, d, V32F32), None)]
        codes = builder.uitofp(nibbles16(builder, field_at(builder, blk, qtype, "qs")), V32F32)
        offset = load_f16(builder, field_at(builder, blk, qtype, "m")) if qtype == QT.Q4_1 else \
            builder.fmul(d, ir.Constant(F32, -8.0))
        return [(codes, splat(builder, d, V32F32), offset)]
    d = load_f16(builder, field_at(builder, blk, qtype, "d"))
    if qtype == QT.Q6_K:  # two scales d * sc per 32 values: sub-blocks of 16
        out = []
        for c in range(8):
            sc = [builder.sitofp(load(builder, field_at(builder, blk, qtype, "scales", 2 * c + k), I8), F32)
                  for k in (0, 1)]
            pair = builder.insert_element(builder.insert_element(ir.Constant(ir.VectorType(F32, 2), ir.Undefined),
                                                                 builder.fmul(d, sc[0]), ir.Constant(I32, 0)),
                                          builder.fmul(d, sc[1]), ir.Constant(I32, 1))
            scale = builder.shuffle_vector(pair, pair, ir.Constant(ir.VectorType(I32, 32), [0] * 16 + [1] * 16))
            codes = builder.sub(q6_k_codes(builder, blk, c), const8(32))
            out.append((builder.sitofp(codes, V32F32), scale, None))
        return out
    dmin = load_f16(builder, field_at(builder, blk, qtype, "dmin"))
    out = []
    for j in range(8):
        sc, m = k_scale_min(builder, blk, qtype, j)
        scale = builder.fmul(d, builder.uitofp(sc, F32))
        out.append((builder.uitofp(k_codes(builder, blk, qtype, j), V32F32), splat(builder, scale, V32F32),
                    builder.fneg(builder.fmul(dmin, builder.uitofp(m, F32)))))
    return out


def prefetch_block(builder, blk, qtype):  # a hint to fetch the cache lines of the bytes AHEAD past this block's
    size = BLOCK_SIZES[qtype][1]
    for line in range(0, size, 64) if size >= 64 else [0]:
        prefetch(builder, builder.add(blk, ir.Constant(I64, AHEAD + line)))
