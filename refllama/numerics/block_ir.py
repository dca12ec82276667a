"""GGUF blocks read in place, in LLVM IR: each type's values as groups of 32 (codes, scale, offset), the unpacking that
the float32 kernels (quant) and ggml's integer kernels (ggml_blocks, ggml_kquants) share. The layouts are
ggml_tables.LAYOUT's; the order of values within a block is ggml's dequantize_row_* (ggml-quants.c)."""

from llvmlite import ir

from ..formats.ggml_types import BLOCK_SIZES
from ..formats.ggml_types import GGMLType as QT
from .ggml_tables import LAYOUT
from .ir import F32, I8, I32, I64, V32F32, V32I8, lanes, load, load_f16, prefetch, splat

V16I8 = ir.VectorType(I8, 16)
GROUPS = {QT.Q4_0: 1, QT.Q4_1: 1, QT.Q5_0: 1, QT.Q8_0: 1, QT.MXFP4: 1,  # 32s per block
          QT.Q4_K: 8, QT.Q5_K: 8, QT.Q6_K: 8}


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


def q5_0_codes(builder, blk, signed=True):  # a Q5_0 block -> <32 x i8> its codes: nibble | fifth bit << 4, minus
    """16 (or, not `signed`, not). Bit j of qh is value j's fifth bit: a mask of 32 lanes (AVX-512: one k-register
    move), each lane's 16 where its bit is set."""
    bits = builder.bitcast(load(builder, field_at(builder, blk, QT.Q5_0, "qh"), I32), ir.VectorType(ir.IntType(1), 32))
    codes = builder.or_(nibbles16(builder, field_at(builder, blk, QT.Q5_0, "qs")),
                        builder.select(bits, const8(16), const8(0)))
    return builder.sub(codes, const8(16)) if signed else codes


def mxfp4_codes(builder, blk):  # an MXFP4 block -> <32 x i8>: ggml_tables.KVALUES_MXFP4 of each nibble
    """0 1 2 3 4 6 8 12 by its low 3 bits m (m, plus m - 4 past 4, plus 2 at 7), negative where its high bit is set."""
    codes = nibbles16(builder, field_at(builder, blk, QT.MXFP4, "qs"))
    m = builder.and_(codes, const8(7))
    above = builder.select(builder.icmp_signed(">", m, const8(4)), builder.sub(m, const8(4)), const8(0))
    seven = builder.select(builder.icmp_signed("==", m, const8(7)), const8(2), const8(0))
    v = builder.add(builder.add(m, above), seven)
    neg = builder.icmp_signed("!=", builder.and_(codes, const8(8)), const8(0))
    return builder.select(neg, builder.sub(const8(0), v), v)


def e8m0_half(builder, blk):  # an MXFP4 block -> its float scale, ggml_tables.e8m0_half of its exponent byte
    return e8m0_halves(builder, builder.zext(load(builder, field_at(builder, blk, QT.MXFP4, "e"), I8), I32))


def e8m0_halves(builder, e):  # exponents (i32 or <n x i32>) -> ggml_tables.e8m0_half of each, float or <n x float>
    def c(v):
        return ir.Constant(e.type, v if isinstance(e.type, ir.IntType) else [v] * e.type.count)

    small = builder.shl(c(0x00200000), e)  # e < 2: the subnormals
    normal = builder.shl(builder.sub(e, c(1)), c(23))
    floats = F32 if isinstance(e.type, ir.IntType) else ir.VectorType(F32, e.type.count)
    return builder.bitcast(builder.select(builder.icmp_unsigned("<", e, c(2)), small, normal), floats)


def k_scales_mins(builder, blk, qtype):
    """Q4_K/Q5_K: the 8 six-bit scales and 8 mins packed in 12 bytes (get_scale_min_k4), as <16 x i32>: scales in
    lanes 0-7, mins in 8-15."""
    return k_scales_mins_rows(builder, [blk], qtype)[0]


def k_scales_mins_rows(builder, blks, qtype):
    """k_scales_mins of the blocks at blks, unpacked side by side: one row's packed words a lane, as whole 32-bit
    words (ggml's x86 kernels do the same, a row at a time): word 0 holds scales 0-3 and the high bits of 4-7, word 1
    mins 0-3 and the high bits of mins 4-7, word 2 the low bits of both."""
    n = len(blks)
    vn = ir.VectorType(I32, n)

    def word(i):  # word i of every row, a row a lane
        v = ir.Constant(vn, ir.Undefined)
        for r, blk in enumerate(blks):
            v = builder.insert_element(v, load(builder, field_at(builder, blk, qtype, "scales", 4 * i), I32),
                                       ir.Constant(I32, r))
        return v

    def c(v):
        return ir.Constant(vn, [v] * n)

    u0, u1, u2 = word(0), word(1), word(2)
    low6, low4, low2 = c(0x3F3F3F3F), c(0x0F0F0F0F), c(0x03030303)
    high = [builder.shl(builder.and_(builder.lshr(u, c(6)), low2), c(4)) for u in (u0, u1)]  # bits 6-7, moved to 4-5
    words = [builder.and_(u0, low6), builder.or_(builder.and_(u2, low4), high[0]),
             builder.and_(u1, low6), builder.or_(builder.and_(builder.lshr(u2, c(4)), low4), high[1])]
    def pair(a, b, r):  # <2 x i32>: lane r of a and of b
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(I32, 2), [r, n + r]))

    rows = [builder.shuffle_vector(pair(*words[:2], r), pair(*words[2:], r), ir.Constant(ir.VectorType(I32, 4), [
        0, 1, 2, 3])) for r in range(n)]  # row r's four words
    return [builder.zext(builder.bitcast(v, V16I8), ir.VectorType(I32, 16)) for v in rows]


def row_totals(builder, vs, n=None):  # n vectors <m x i32> -> <n x i32>: lane r the sum of vs[r]'s lanes (n <= m,
    """powers of 2). Neighbouring lanes added, two vectors' into one at a time, until each row's sum is one lane: the
    rows' totals side by side in fewer shuffles than a reduction a row. (Integer sums: their order changes no bit.)
    Another n: the result's lanes, each the sum of len(vs) * m / n neighbouring lanes of the vectors in turn."""
    def pairs(a, b):  # <m> a, <m> b -> <m>: a's neighbours' sums, then b's
        m = a.type.count
        return builder.add(*[builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(I32, m), list(range(o, 2 * m, 2))))
                             for o in (0, 1)])

    n = len(vs) if n is None else n
    while len(vs) > 1:
        vs = [pairs(vs[k], vs[k + 1]) for k in range(0, len(vs), 2)]
    v = vs[0]  # row r in lanes r m / n .. (r + 1) m / n - 1
    while v.type.count > n:
        half = v.type.count // 2
        v = pairs(lanes(builder, v, 0, half), lanes(builder, v, half, half))
    return v


def broadcast_lane(builder, v, i, n):  # lane i of vector v repeated n times
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), [i] * n))


def q6_k_codes(builder, blk, c):
    """Q6_K's values 32c .. 32c + 31 as <32 x i8>, 0..63 (the signed code is this minus 32): of each 128 values,
    the quarter i takes ql's low nibbles (i = 0, 1) or high ones (2, 3) of bytes 32 (i % 2) .., and bits 2i, 2i + 1
    of qh."""
    h, i = divmod(c, 4)
    low = nibbles32(builder, field_at(builder, blk, QT.Q6_K, "ql", 64 * h + 32 * (i % 2)), i >= 2)
    high = bits32(builder, field_at(builder, blk, QT.Q6_K, "qh", 32 * h), 2 * i, 2)
    return builder.or_(low, builder.shl(high, const8(4)))


def k_crumbs(builder, blk, qtype, c):  # Q2_K/Q3_K: values 32c .. 32c + 31's two low bits as <32 x i8>
    return bits32(builder, field_at(builder, blk, qtype, "qs", 32 * (c // 4)), 2 * (c % 4), 2)


def q3_k_scales(builder, blk):  # Q3_K: its 16 six-bit scales (12 bytes: low 4 bits, then high 2) as <16 x i8>, -32
    def word(i):
        return load(builder, field_at(builder, blk, QT.Q3_K, "scales", 4 * i), I32)

    def c(v):
        return ir.Constant(I32, v)

    a0, a1, a2 = word(0), word(1), word(2)
    low, high = c(0x0F0F0F0F), c(0x03030303)

    def part(a, down, up):  # (a >> down) & low | ((a2 >> up) & high) << 4
        return builder.or_(builder.and_(builder.lshr(a, c(down)), low),
                           builder.shl(builder.and_(builder.lshr(a2, c(up)), high), c(4)))

    v = ir.Constant(ir.VectorType(I32, 4), ir.Undefined)
    for i, w in enumerate((part(a0, 0, 0), part(a1, 0, 2), part(a0, 4, 4), part(a1, 4, 6))):
        v = builder.insert_element(v, w, c(i))
    return builder.sub(builder.bitcast(v, V16I8), ir.Constant(V16I8, [32] * 16))


def k_codes(builder, blk, qtype, j):  # Q4_K/Q5_K: sub-block j's 32 codes (0..15 or 0..31) as <32 x i8>
    low = nibbles32(builder, field_at(builder, blk, qtype, "qs", 32 * (j // 2)), j % 2 == 1)
    if qtype == QT.Q4_K:
        return low
    return builder.or_(low, builder.shl(bits32(builder, field_at(builder, blk, qtype, "qh"), j, 1), const8(4)))


def groups(builder, qtype, blk):
    """IR of the block at blk, a group of 32 values at a time: ([(codes <32 x float>, scale <32 x float>)], offsets),
    value = scale * code + offsets[g], each product as ggml's dequantize_row_* takes it (d * sc of the K-quants is
    exact in float32, as is -8 d of Q4_0). offsets: a vector of one per group, or None for the types without."""
    if qtype == QT.MXFP4:  # its codes twice E2M1's values, its scale half the E8M0 power of two
        scale = splat(builder, e8m0_half(builder, blk), V32F32)
        return [(builder.sitofp(mxfp4_codes(builder, blk), V32F32), scale)], None
    d = load_f16(builder, field_at(builder, blk, qtype, "d"))
    if qtype in (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q8_0):
        if qtype == QT.Q8_0:
            codes = builder.sitofp(load(builder, field_at(builder, blk, qtype, "qs"), V32I8), V32F32)
        elif qtype == QT.Q5_0:
            codes = builder.sitofp(q5_0_codes(builder, blk), V32F32)
        else:
            codes = builder.uitofp(nibbles16(builder, field_at(builder, blk, qtype, "qs")), V32F32)
        offsets = None
        if qtype in (QT.Q4_0, QT.Q4_1):
            offset = load_f16(builder, field_at(builder, blk, qtype, "m")) if qtype == QT.Q4_1 else \
                builder.fmul(d, ir.Constant(F32, -8.0))
            offsets = builder.insert_element(ir.Constant(ir.VectorType(F32, 1), ir.Undefined), offset,
                                             ir.Constant(I32, 0))
        return [(codes, splat(builder, d, V32F32))], offsets
    v16 = ir.VectorType(F32, 16)
    if qtype == QT.Q6_K:  # two scales d * sc per 32 values: sub-blocks of 16
        sc = builder.sitofp(load(builder, field_at(builder, blk, qtype, "scales"), V16I8), v16)
        scales = builder.fmul(splat(builder, d, v16), sc)
        pairs = [builder.shuffle_vector(scales, scales, ir.Constant(ir.VectorType(I32, 32), [2 * c] * 16 + [
            2 * c + 1] * 16)) for c in range(8)]
        return [(builder.sitofp(builder.sub(q6_k_codes(builder, blk, c), const8(32)), V32F32), pairs[c])
                for c in range(8)], None
    dmin = load_f16(builder, field_at(builder, blk, qtype, "dmin"))
    factors = builder.shuffle_vector(splat(builder, d, ir.VectorType(F32, 8)), splat(builder, dmin, ir.VectorType(
        F32, 8)), ir.Constant(ir.VectorType(I32, 16), list(range(16))))  # d in lanes 0-7, dmin in 8-15
    both = builder.fmul(factors, builder.uitofp(k_scales_mins(builder, blk, qtype), v16))  # d * sc, dmin * m
    offsets = builder.fneg(builder.shuffle_vector(both, both, ir.Constant(ir.VectorType(I32, 8), list(range(8, 16)))))
    return [(builder.uitofp(k_codes(builder, blk, qtype, j), V32F32), broadcast_lane(builder, both, j, 32))
            for j in range(8)], offsets


def prefetch_block(builder, blk, qtype, ahead):  # a hint to fetch the cache lines of the bytes `ahead` (IR i64:
    size = BLOCK_SIZES[qtype][1]  # rows_ahead) past this block's
    for line in range(0, size, 64) if size >= 64 else [0]:
        prefetch(builder, builder.add(blk, builder.add(ahead, ir.Constant(I64, line))))


def rows_ahead(builder, row_bytes, n_rows):
    """The prefetch distance of a kernel reading n_rows rows side by side, each in order: the same place n_rows rows
    on, the rows the thread reads next. (A fixed distance along the row lands, in a short row, in the rows being
    read already: an expert's rows of 768 or 2048 values.)"""
    return builder.mul(row_bytes, ir.Constant(I64, n_rows))
