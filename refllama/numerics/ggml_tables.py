"""ggml's tables, each in one place: its block layouts (ggml-common.h) with the unpacking of codes and scales that the
Numba repacking (quant), the ggml emulation (ggml_numerics) and its kernels (ggml_blocks, ggml_kquants) all build
on; every float16 value and the rounding to float16; the constants of ggml's expf."""

import numpy as np

from ..formats.ggml_types import BLOCK_SIZES
from ..formats.ggml_types import GGMLType as QT

LAYOUT = {  # type -> field -> (first byte, end) within one block
    QT.Q4_0: {"d": (0, 2), "qs": (2, 18)},  # qs: 32 nibbles, byte j holding value j (low) and j + 16 (high)
    QT.Q4_1: {"d": (0, 2), "m": (2, 4), "qs": (4, 20)},
    QT.Q5_0: {"d": (0, 2), "qh": (2, 6), "qs": (6, 22)},  # qh: bit j is value j's fifth bit
    QT.Q5_1: {"d": (0, 2), "m": (2, 4), "qh": (4, 8), "qs": (8, 24)},
    QT.Q8_0: {"d": (0, 2), "qs": (2, 34)},  # int8 codes
    QT.Q2_K: {"scales": (0, 16), "qs": (16, 80), "d": (80, 82), "dmin": (82, 84)},  # 16 x (4-bit scale, 4-bit min)
    QT.Q3_K: {"hmask": (0, 32), "qs": (32, 96), "scales": (96, 108), "d": (108, 110)},  # 16 six-bit scales
    QT.Q4_K: {"d": (0, 2), "dmin": (2, 4), "scales": (4, 16), "qs": (16, 144)},  # 8 six-bit scales and mins
    QT.Q5_K: {"d": (0, 2), "dmin": (2, 4), "scales": (4, 16), "qh": (16, 48), "qs": (48, 176)},
    QT.Q6_K: {"ql": (0, 128), "qh": (128, 192), "scales": (192, 208), "d": (208, 210)},  # 16 int8 scales
    QT.MXFP4: {"e": (0, 1), "qs": (1, 17)},  # e: an E8M0 exponent; qs: 32 E2M1 nibbles, laid out as Q4_0's
}
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)  # twice E2M1's values
F16_TABLE = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)  # bits -> value
# ggml_v_expf's constants (ggml-cpu/vec.h): rounding shift, log2(e), ln 2 in two parts, the polynomial's c5 .. c1
EXPF_R, EXPF_LOG2E, EXPF_LN2_LO, EXPF_LN2_HI, EXPF_C5, EXPF_C4, EXPF_C3, EXPF_C2, EXPF_C1 = (
    np.float32(float.fromhex(c)) for c in ("0x1.8p23", "0x1.715476p+0", "0x1.7f7d1cp-20", "0x1.62e4p-1",
                                           "0x1.0e4020p-7", "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2",
                                           "0x1.ffffecp-1"))


def round_f16(x):  # [...] f32 -> [...] f32 holding float16 values (round to nearest even, as F16C does)
    return x.astype(np.float16).astype(np.float32)


def bf16_bits(x):  # [...] f32 -> [...] bfloat16 bits (uint16), rounded to nearest even as torch rounds; NaN stays NaN
    u = np.asarray(x, np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def round_bf16(x):  # [...] f32 -> [...] f32 holding bfloat16 values
    return (bf16_bits(x).astype(np.uint32) << 16).view(np.float32)


def blocks(raw, qtype, shape):  # [N, row bytes] -> [N, K/block, block bytes]
    N, K = shape
    block, size = BLOCK_SIZES[qtype]
    return np.asarray(raw).reshape(N, K // block, size)


def field(b, qtype, name):  # [..., block bytes] -> [..., the field's bytes]
    start, end = LAYOUT[qtype][name]
    return b[..., start:end]


def f16_bits(a):  # [..., 2] bytes -> [...] uint16, the float16 values' bits
    return np.ascontiguousarray(a).view(np.uint16)[..., 0]


def f16(a):  # [..., 2] bytes -> [...] f32
    return F16_TABLE[f16_bits(a)]


def e8m0_half(e):  # [...] uint8 -> [...] f32: 2^(e - 128), half the E8M0 scale (KVALUES_MXFP4 are twice E2M1's)
    """ggml_e8m0_to_fp32_half: e < 2 the subnormals 2^-128, 2^-127; else the float32 of exponent e - 1."""
    e = np.asarray(e, np.uint32)
    return np.where(e < 2, np.uint32(0x00200000) << e, (e - 1) << 23).astype(np.uint32).view(np.float32)


def nibbles(qs):  # [..., 16] bytes -> [..., 32] codes: byte j holds value j (low nibble) and j + 16 (high)
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def high_bits(qh, n):  # [..., 4] bytes of a little-endian uint32 -> [..., n] its low n bits, bit j for value j
    return (np.ascontiguousarray(qh).view("<u4") >> np.arange(n, dtype=np.uint32)) & 1


def k_scales(scales):  # Q4_K/Q5_K [..., 12] bytes -> sc, m [..., 8] f32: 6-bit scales and mins packed in 12 bytes
    from gguf.quants import Q4_K

    shape = scales.shape[:-1]
    sc, m = Q4_K.get_scale_min(np.ascontiguousarray(scales).reshape(-1, 12))
    return sc.reshape(*shape, 8).astype(np.float32), m.reshape(*shape, 8).astype(np.float32)


def k_nibbles(qs):  # Q4_K/Q5_K [..., 128] bytes -> [..., 256]: each 64 values are 32 low nibbles, then 32 high
    shape = qs.shape[:-1]
    return (qs.reshape(*shape, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(2, 1) & 15).reshape(*shape, 256)


def k_crumbs(qs):  # Q2_K/Q3_K [..., 64] bytes -> [..., 256]: value 128j + 32k + b is bits 2k, 2k+1 of byte 32j + b
    shape = qs.shape[:-1]
    return (qs.reshape(*shape, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1) & 3).reshape(*shape, 256)


def q3_k_scales(scales):  # Q3_K [..., 12] bytes -> [..., 16] f32: six-bit scales - 32 (low 4 bits, then high 2)
    aux = np.ascontiguousarray(scales).view("<u4")  # [..., 3]
    a0, a1, a2 = aux[..., 0], aux[..., 1], aux[..., 2]
    low, high = np.uint32(0x0F0F0F0F), np.uint32(0x03030303)
    words = np.stack([(a0 & low) | ((a2 & high) << 4), (a1 & low) | (((a2 >> 2) & high) << 4),
                      ((a0 >> 4) & low) | (((a2 >> 4) & high) << 4), ((a1 >> 4) & low) | (((a2 >> 6) & high) << 4)],
                     axis=-1).astype("<u4")
    return words.view(np.uint8).astype(np.float32) - 32


def codes(b, qtype):  # [..., block bytes] -> [..., values per block] int8: the integers ggml's dot product multiplies
    """Q4_0: nibble - 8, Q5_0: 5 bits - 16, Q6_K: 6 bits - 32, Q3_K: 3 bits - 4 (its high bit: hmask), MXFP4: the
    nibble's KVALUES_MXFP4; Q4_1, Q5_1, Q2_K, Q4_K, Q5_K and Q8_0 as stored."""
    qs = field(b, qtype, "qs") if "qs" in LAYOUT[qtype] else None
    if qtype == QT.Q8_0:
        return np.ascontiguousarray(qs).view(np.int8)
    if qtype in (QT.Q4_0, QT.Q4_1):
        return nibbles(qs).astype(np.int8) - np.int8(8 if qtype == QT.Q4_0 else 0)
    if qtype == QT.MXFP4:
        return KVALUES_MXFP4[nibbles(qs)]
    if qtype in (QT.Q5_0, QT.Q5_1):
        fifth = (high_bits(field(b, qtype, "qh"), 32) << 4).astype(np.uint8)
        return (nibbles(qs) | fifth).astype(np.int8) - np.int8(16 if qtype == QT.Q5_0 else 0)
    if qtype == QT.Q4_K:
        return k_nibbles(qs).astype(np.int8)
    shape = b.shape[:-1]
    if qtype == QT.Q2_K:
        return k_crumbs(qs).astype(np.int8)
    if qtype == QT.Q3_K:  # hmask [32]: bit i of byte b is the high bit of value 32 i + b (0: minus 4)
        high = (field(b, qtype, "hmask").reshape(*shape, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1
        return k_crumbs(qs).astype(np.int8) - np.int8(4) * (1 - high.reshape(*shape, 256)).astype(np.int8)
    if qtype == QT.Q5_K:  # qh [32]: bit i of byte l is the fifth bit of value l of the i-th group of 32
        high = (field(b, qtype, "qh").reshape(*shape, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1
        return (k_nibbles(qs) | (high.reshape(*shape, 256) << 4)).astype(np.int8)
    # Q6_K: each 128 values take 64 ql bytes (low 4 bits) and 32 qh bytes (high 2 bits)
    lo = (field(b, qtype, "ql").reshape(*shape, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(2, 1)) & 15
    hi = (field(b, qtype, "qh").reshape(*shape, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)) & 3
    return ((lo.reshape(*shape, 2, 4, 32) | (hi << 4)).astype(np.int8) - np.int8(32)).reshape(*shape, 256)
