"""The integers of llama.cpp's quantized products: activations rounded to their weight type's "vec-dot type"
(ggml-cpu.c's `type_traits_cpu`: Q8_0 for Q4_0, Q5_0 and Q8_0; Q8_1, which adds the block's scaled sum, for Q4_1 and
Q5_1; Q8_K, blocks of 256, for the K-quants), a GGUF matrix as the integers its dot product multiplies with its
scales (IntWeights), and their exact block sums. The product forms that add them up in float32 are each CPU
family's own: refllama.numerics.ggml_x86 and ggml_arm.
"""

from typing import NamedTuple

import numpy as np

from ..formats.ggml_types import GGMLType as QT
from ..xp import array_module
from .ggml_tables import blocks, codes, e8m0_half, f16, field, k_scales, q3_k_scales, round_f16

Q8_0, Q8_1, Q8_K = "Q8_0", "Q8_1", "Q8_K"
VEC_DOT_TYPE = {QT.Q4_0: Q8_0, QT.Q5_0: Q8_0, QT.Q8_0: Q8_0, QT.MXFP4: Q8_0,  # ggml-cpu.c
                QT.Q4_1: Q8_1, QT.Q5_1: Q8_1, QT.Q2_K: Q8_K, QT.Q3_K: Q8_K, QT.Q4_K: Q8_K, QT.Q5_K: Q8_K, QT.Q6_K: Q8_K}
GROUP = {QT.Q2_K: 16, QT.Q3_K: 16, QT.Q6_K: 16}  # values per integer sum: 32, but sub-blocks of 16 in these
SUPER = {QT.Q2_K: 256, QT.Q3_K: 256, QT.Q4_K: 256, QT.Q5_K: 256, QT.Q6_K: 256}  # values per d: 32, the K-quants' 256


def quantize_q8_0(x, inverse_d=False):  # [T, K] f32 -> q [T, K] int8, d32, d [T, K/32] f32 (d: float16 values)
    """Blocks of 32: d = amax / 127, q = round-half-even(x * (127 / amax)) (127 / amax, not 1 / d; 0 for an
    all-zero block); d is stored as float16 (d32: before that rounding, which Q8_1's s uses). ggml's x86
    quantize_row_q8_0; its ARM one (`inverse_d`) scales by 1 / d; the portable C one rounds half away."""
    xp = array_module(x)
    T, K = x.shape
    b = x.reshape(T, K // 32, 32)
    amax = xp.abs(b).max(axis=-1)  # [T, K/32]
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = xp.where(amax != 0, (np.float32(1) / d) if inverse_d else (np.float32(127) / amax), np.float32(0))
    q = xp.rint(b * inv[..., None]).astype(np.int8)  # [T, K/32, 32]
    return q.reshape(T, K), d, round_f16(d)


def quantize_q8_1(x, inverse_d=False):  # [T, K] f32 -> q [T, K] int8, d [T, K/32], s [T, K/32] f32 (float16 values)
    """Q8_0's codes and scale, and s = d * sum(q) per block, with the float32 d before its float16 rounding."""
    T, K = x.shape
    q, d32, d = quantize_q8_0(x, inverse_d)
    s = d32 * q.reshape(T, K // 32, 32).sum(axis=-1, dtype=np.int32).astype(np.float32)
    return q, d, round_f16(s)


def quantize_q8_K(x, in_fours=False, fused=False):  # [T, K] f32 -> q [T, K] int8, d [T, K/256], bsums [T, K/16]
    """Blocks of 256: `max` is the signed value of the first largest |x|; q = min(127, round-half-even(x * -127 /
    max)), d = 1 / (-127 / max) in float32; bsums are the sums of each 16 codes. A zero block: d = 0, q = 0.
    ggml's quantize_row_q8_K_ref, which its x86 build uses too. `in_fours`: the rows that a repacked matrix's
    gemm takes, four at a time (the first T - T % 4), as x86's ggml_quantize_mat_q8_K_4x8 does: `max` is +|x|max
    when any value equals it, else -|x|max (a tie of +a and -a goes to +a whatever their order). `fused`: ARM's
    build, where GCC fuses x * iscale into nearest_int's magic-number addition: the exact product rounded (float64
    holds it), not the float32 one."""
    xp = array_module(x)
    T, K = x.shape
    b = x.reshape(T, K // 256, 256)
    first = xp.abs(b).argmax(axis=-1)[..., None]  # argmax: the first index of the largest
    mx = xp.take_along_axis(b, first, axis=-1)[..., 0]  # [T, K/256]
    if in_fours:
        four = T - T % 4
        mx[:four] = xp.where((b[:four] == xp.abs(mx[:four])[..., None]).any(axis=-1), xp.abs(mx[:four]), mx[:four])
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = xp.where(mx != 0, np.float32(-127) / mx, np.float32(0))
        d = xp.where(mx != 0, np.float32(1) / iscale, np.float32(0))
    product = (b.astype(np.float64) if fused else b) * iscale[..., None]
    q = xp.minimum(127, xp.rint(product)).astype(np.int8).reshape(T, K)
    return q, d, q.reshape(T, K // 16, 16).sum(axis=-1, dtype=np.int32)


class IntWeights(NamedTuple):
    """A quantized [N, K] matrix as ggml's dot product reads it: w = d * sc * code - dmin * m per group.

    codes: [N, K] int8, the integers multiplied by the activation's codes (Q4_0: nibble - 8, Q5_0: 5 bits - 16,
        Q6_K: 6 bits - 32, Q4_1/Q5_1/Q4_K/Q5_K: as stored, Q8_0: as stored, MXFP4: twice its E2M1 values);
    d: [N, K/SUPER] f32, the float scale of each block (32 values; the K-quants' 256);
    sc: [N, K/GROUP] f32 integers, the K-quants' sub-block scales (None elsewhere);
    m: Q4_1/Q5_1: [N, K/32] f32, the offset of each block; Q4_K/Q5_K: [N, K/32] f32 integers, each sub-block's min;
    dmin: Q4_K/Q5_K: [N, K/256] f32, the scale of the mins (None elsewhere).
    """

    qtype: QT
    codes: np.ndarray
    d: np.ndarray
    sc: object = None
    m: object = None
    dmin: object = None


def int_weights(raw, qtype, shape):
    """IntWeights of a GGUF matrix's raw bytes [N, row bytes] (ggml_tables decodes the block layouts)."""
    N, K = shape
    b = blocks(raw, qtype, shape)  # [N, K/block, block bytes]
    q = codes(b, qtype).reshape(N, K)
    if qtype == QT.MXFP4:  # its scale: half its E8M0 exponent's power of two
        return IntWeights(qtype, q, e8m0_half(field(b, qtype, "e")[..., 0]))
    d = f16(field(b, qtype, "d"))  # [N, K/block]
    if qtype in (QT.Q4_0, QT.Q5_0, QT.Q8_0):
        return IntWeights(qtype, q, d)
    if qtype in (QT.Q4_1, QT.Q5_1):
        return IntWeights(qtype, q, d, m=f16(field(b, qtype, "m")))
    if qtype == QT.Q6_K:
        sc = np.ascontiguousarray(field(b, qtype, "scales")).view(np.int8).astype(np.float32)  # [N, K/256, 16]
        return IntWeights(qtype, q, d, sc=sc.reshape(N, -1))
    if qtype == QT.Q3_K:
        return IntWeights(qtype, q, d, sc=q3_k_scales(field(b, qtype, "scales")).reshape(N, -1))
    if qtype == QT.Q2_K:  # each byte a sub-block's scale (low 4 bits) and min (high 4)
        packed = field(b, qtype, "scales")
        return IntWeights(qtype, q, d, sc=(packed & 15).astype(np.float32).reshape(N, -1),
                          m=(packed >> 4).astype(np.float32).reshape(N, -1), dmin=f16(field(b, qtype, "dmin")))
    sc, m = k_scales(field(b, qtype, "scales"))  # [N, K/256, 8] each
    return IntWeights(qtype, q, d, sc=sc.reshape(N, -1), m=m.reshape(N, -1), dmin=f16(field(b, qtype, "dmin")))


def dequantize(w):  # IntWeights -> [N, K] f32, in ggml's order of float operations (dequantize_row_*)
    N, K = w.codes.shape
    codes = w.codes.astype(np.float32)
    group, sup = GROUP.get(w.qtype, 32), SUPER.get(w.qtype, 32)
    d = np.repeat(w.d, sup // group, axis=1)  # [N, K/group]
    if w.sc is not None:
        d = d * w.sc
    x = codes.reshape(N, -1, group) * d[..., None]
    if w.dmin is not None:
        x = x - (np.repeat(w.dmin, w.m.shape[1] // w.dmin.shape[1], axis=1) * w.m)[..., None]
    elif w.m is not None:
        x = x + w.m[..., None]
    return x.reshape(N, K)


def block_sums(xq, codes_t, group):  # [T, K] int8, [K/group, group, N] f32 -> [K/group, T, N] f32
    """Integer sums of x code times weight code over each group: exact, as every partial sum is an integer
    below 2^24 (32 * 127 * 127 at most), which BLAS adds in float32 without rounding."""
    xp = array_module(xq)
    T, K = xq.shape
    xg = xq.astype(np.float32).reshape(T, K // group, group).transpose(1, 0, 2)  # [K/group, T, group]
    return xp.matmul(xg, codes_t)
