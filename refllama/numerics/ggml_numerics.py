"""llama.cpp's CPU arithmetic (`numerics="ggml"`), written out in NumPy: the readable emulation.

llama.cpp does not multiply a quantized weight by float32 activations. Before each product it rounds the
activations to the weight type's "vec-dot type" (ggml-cpu.c, `type_traits_cpu`): 8-bit codes with a scale per
block (Q8_0 for Q4_0, Q5_0 and Q8_0; Q8_1, which adds the block's scaled sum, for Q4_1 and Q5_1; Q8_K, blocks of
256, for the K-quants). The product is then integer within a block and float across blocks. A float16 matrix
(the KV cache, F16 weights) rounds its float32 operand to float16 likewise. This module does the same:
  quantize_q8_0 / quantize_q8_1 / quantize_q8_K: the x86 rules (round half to even, scales as ggml keeps them);
  IntWeights: a GGUF matrix as the integers its dot product multiplies, with its scales;
  GgmlMatrix: `x @ w.T` = quantize x, integer sums per block, scale and add as llama.cpp does.
The block sums are exact (integers below 2^24 summed in float32 by BLAS), so only the float steps after them can
differ from llama.cpp, and those in the order of float32 additions. refllama.numerics.ggml_kernels does the same faster.
"""

import ctypes
import ctypes.util
import math
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import numpy as np
from numba import njit, vectorize

from ..errors import RefllamaError
from ..formats.ggml_types import GGMLType as QT
from ..formats.ggml_types import QuantizedTensor
from ..layers import Ops, linear, rms_norm, yarn_ramp
from ..xp import Placement, array_module
from . import ggml_tables
from .cpu_paths import TYPES
from .ggml_tables import F16_TABLE, blocks, codes, f16, field, k_scales, q3_k_scales, round_f16
from .matrices import WeightMatrix, mul_mat_id

Q8_0, Q8_1, Q8_K = "Q8_0", "Q8_1", "Q8_K"
VEC_DOT_TYPE = {QT.Q4_0: Q8_0, QT.Q5_0: Q8_0, QT.Q8_0: Q8_0, QT.Q4_1: Q8_1, QT.Q5_1: Q8_1,  # ggml-cpu.c
                QT.Q2_K: Q8_K, QT.Q3_K: Q8_K, QT.Q4_K: Q8_K, QT.Q5_K: Q8_K, QT.Q6_K: Q8_K}
EMULATED = frozenset(VEC_DOT_TYPE)
AVX512 = "avx512-vnni"  # the CPU path (refllama.numerics.cpu_paths) a call takes unless told
NEON, I8MM = "neon-dotprod", "neon-i8mm"  # ARM's with dotprod and float16 arithmetic, and with i8mm too
# llama.cpp repacks these at load into interleaved forms on these paths, if their rows are a multiple of the form's
# (ggml_repack_get_optimal_repack_type): type -> {path: (form, rows)}
REPACK = {QT.Q4_0: {AVX512: ("q4_0_8x8_q8_0", 8), "avx2": ("q4_0_8x8_q8_0", 8), NEON: ("q4_0_4x4_q8_0", 4),
                    I8MM: ("q4_0_4x8_q8_0", 4)},
          QT.Q4_K: {AVX512: ("q4_K_8x8_q8_K", 8), "avx2": ("q4_K_8x8_q8_K", 8), NEON: ("q4_K_8x4_q8_K", 8),
                    I8MM: ("q4_K_8x8_q8_K", 8)},
          QT.Q5_K: {NEON: ("q5_K_8x4_q8_K", 8), I8MM: ("q5_K_8x8_q8_K", 8)},
          QT.Q6_K: {NEON: ("q6_K_8x4_q8_K", 8), I8MM: ("q6_K_8x8_q8_K", 8)},
          QT.Q2_K: {AVX512: ("q2_K_8x8_q8_K", 8)}, QT.Q8_0: {NEON: ("q8_0_4x4_q8_0", 4), I8MM: ("q8_0_4x8_q8_0", 4)}}
UNFUSED_GEMM = {"q8_0_4x4_q8_0"}  # repacked forms whose gemm adds acc + isum * scale (vmlaq_f32: GCC keeps it unfused)
# ARM's repacked K-quant forms, (form, gemv or gemm) -> (values a float step sums, whether acc = fma(isum, d_w d_x,
# acc) (else acc + isum * (d_w d_x), the product rounded first), when the mins come off: a block's "after" its sums
# or "first", or "each" 64 values' after theirs; the mins always acc - msum * (dmin_w d_x), unfused (vmlsq_f32).
# Read in arch/arm/repack.cpp and in the builds' code (which vmulq/vaddq pairs GCC fuses).
ARM_K_FORMS = {("q4_K_8x4_q8_K", "gemv"): (64, True, "after"), ("q4_K_8x4_q8_K", "gemm"): (64, True, "after"),
               ("q5_K_8x4_q8_K", "gemv"): (64, True, "after"), ("q5_K_8x4_q8_K", "gemm"): (64, True, "after"),
               ("q6_K_8x4_q8_K", "gemv"): (256, True, None), ("q6_K_8x4_q8_K", "gemm"): (256, False, None),
               ("q4_K_8x8_q8_K", "gemv"): (32, True, "after"), ("q4_K_8x8_q8_K", "gemm"): (256, False, "first"),
               ("q5_K_8x8_q8_K", "gemv"): (32, True, "each"), ("q5_K_8x8_q8_K", "gemm"): (256, False, "first"),
               ("q6_K_8x8_q8_K", "gemv"): (256, False, None), ("q6_K_8x8_q8_K", "gemm"): (256, False, None)}
GEMM_STEP = {QT.Q4_K: 2, QT.Q2_K: 4}  # a repacked gemm's float step, in sub-blocks of 32 (the gemv's: a block)
GROUP = {QT.Q2_K: 16, QT.Q3_K: 16, QT.Q6_K: 16}  # values per integer sum: 32, but sub-blocks of 16 in these
SUPER = {QT.Q2_K: 256, QT.Q3_K: 256, QT.Q4_K: 256, QT.Q5_K: 256, QT.Q6_K: 256}  # values per d: 32, the K-quants' 256


def repacked(qtype, shape, path=AVX512):
    """The interleaved form llama.cpp's CPU backend on a path (its CPU_REPACK buffers on) multiplies this matrix in,
    or None."""
    form = REPACK.get(qtype, {}).get(path)
    return form[0] if form is not None and shape[0] % form[1] == 0 else None


def mmla_pairs(N, T, threads=1):  # -> [T, N] bool: the outputs ggml's mul_mat gives to a two-row vec_dot
    """ARM's i8mm vec_dots (Q4_0, Q4_1, Q8_0: vmmlaq_s32) take two rows and two tokens at once where the product's
    N and T are even and so are both ranges of the work chunk (ggml_compute_forward_mul_mat): chunks of 16 x 16 (64
    where N or T is 1), re-planned as one chunk a thread where there are fewer than 4 a thread, each range
    ceil(N / chunks) long. `threads`: llama.cpp's (the ARM references run 1); the plan depends on it only in that
    re-planning."""
    if N % 2 or T % 2:
        return np.zeros((T, N), bool)
    size = 64 if N == 1 or T == 1 else 16
    n0, n1 = -(-N // size), -(-T // size)
    if n0 * n1 < 4 * threads:
        n0, n1 = (threads, 1) if N > T else (1, threads)

    def even(n, d):  # [n] bool: whether the chunk (of d) each index falls in has an even length
        start = np.arange(n) // d * d
        return (np.minimum(start + d, n) - start) % 2 == 0

    return even(T, -(-T // n1))[:, None] & even(N, -(-N // n0))[None, :]


def fma(a, b, c):  # [...] f32 -> a * b + c rounded once to float32, as an FMA instruction
    """float64 holds the product of two float32 numbers exactly; the sum is rounded twice (53 bits, then 24), which
    differs from one rounding only when the 53-bit result is a float32 tie: never seen on llama.cpp's values."""
    return (a.astype(np.float64) * b + c).astype(np.float32)


def expf(x):  # [...] f32 -> [...] f32: ggml_v_expf (ggml-cpu/vec.h), its AVX-512 form
    """exp(x) = 2^n * p(b), n = round(x / ln 2), b = x - n ln 2 (ln 2 in two parts), p a degree-5 polynomial:
    within 2.2 ulp of the true exp (measured on [-100, 80]), and what llama.cpp's softmax and SiLU use. (Its AVX2
    form ends with k + k * p(b) - 1 instead of a scaling, and rounds differently in the last bit.)"""
    f, t = np.float32, ggml_tables

    with np.errstate(invalid="ignore", over="ignore"):
        z = fma(x, t.EXPF_LOG2E, t.EXPF_R)
        n = z - t.EXPF_R
        b = fma(-n, t.EXPF_LN2_LO, fma(-n, t.EXPF_LN2_HI, x))
        u = b * b
        j = fma(fma(fma(t.EXPF_C5, b, t.EXPF_C4), u, fma(t.EXPF_C3, b, t.EXPF_C2)), u, fma(t.EXPF_C1, b, f(1.0)))
        res = np.ldexp(j, np.nan_to_num(n, posinf=0, neginf=0).astype(np.int32))  # _mm512_scalef_ps
        return np.where(np.abs(n) > 192, np.where(n <= 0, f(0), f(np.inf)), res).astype(np.float32)


def expf_avx2(x):  # [...] f32 -> [...] f32: ggml_v_expf's AVX2 form
    """The same n, b and polynomial, but the scaling done in integers: k = 2^n as the bits (z << 23) + bits(1.0), the
    result k + k * (p(b) - 1) (p's constant term left out of the polynomial); |n| > 126 splits 2^n in two factors,
    |n| > 192 is 0 or inf."""
    f, t, u32 = np.float32, ggml_tables, np.uint32

    with np.errstate(invalid="ignore", over="ignore"):
        z = fma(x, t.EXPF_LOG2E, t.EXPF_R)
        n = z - t.EXPF_R
        b = fma(-n, t.EXPF_LN2_LO, fma(-n, t.EXPF_LN2_HI, x))
        e = z.view(u32) << u32(23)
        k = (e + f(1.0).view(u32)).view(f)
        u = b * b
        j = fma(fma(fma(t.EXPF_C5, b, t.EXPF_C4), u, fma(t.EXPF_C3, b, t.EXPF_C2)), u, t.EXPF_C1 * b)
        g = np.where(n <= 0, u32(0x82000000), u32(0))
        s1, s2 = (g + u32(0x7F000000)).view(f), (e - g).view(f)
        big = np.abs(n)
        return np.where(big > 192, s1 * s1, np.where(big > 126, fma(s2, j, s2) * s1, fma(k, j, k))).astype(f)


def reduce_halves(a):  # [..., w] f32 -> [...] f32 (w a power of 2): the high half added to the low one until one
    """lane is left: _mm512_reduce_add_ps for 16 lanes, an __m256's hsum (extract, movehl, movehdup) for 8."""
    while a.shape[-1] > 1:
        a = a[..., a.shape[-1] // 2:] + a[..., :a.shape[-1] // 2]
    return a[..., 0]


def reduce_pairs(a):  # [..., w] f32 -> [...] f32 (w a power of 2): ARM's vaddvq_f32 (FADDP): neighbouring lanes
    """added, then neighbouring sums, until one is left."""
    while a.shape[-1] > 1:
        a = a[..., 0::2] + a[..., 1::2]
    return a[..., 0]


def reduce_hadd8(a):  # [..., 8] f32 -> [...] f32: GGML_F32x8_REDUCE's end, the halves added, then two _mm_hadd_ps
    t = a[..., :4] + a[..., 4:]
    return (t[..., 0] + t[..., 1]) + (t[..., 2] + t[..., 3])


class Lanes(NamedTuple):
    """What a CPU path's float kernels look like (refllama.numerics.cpu_paths): `width` float32 lanes a vector;
    ggml_v_expf's form (ARM's is AVX2's); how GGML_F32_VEC_REDUCE sums a vector's lanes at the end of a vec_dot (4
    vectors of accumulators, added (0 + 2) + (1 + 3) first); how a single vector is summed (tinyBLAS's hsum,
    softmax's groups); whether float16 products are summed in float16 lanes (ARM's FP16 vector arithmetic: 8 a
    vector) rather than float32 ones; the fewest tokens llamafile's tinyBLAS takes an F32 and an F16 matrix for;
    whether Q8_0 activations scale by 1 / d (ARM) rather than 127 / amax (x86); whether the build has llamafile's
    tinyBLAS at all (ggml-cpu.c leaves it out of ARM builds with i8mm or SVE: every product is a vec_dot)."""

    width: int
    expf: Callable
    reduce: Callable
    hsum: Callable = reduce_halves
    half: bool = False
    tiny_f32: int = 2
    tiny_f16: int = 2
    inverse_d: bool = False
    llamafile: bool = True


LANES = {AVX512: Lanes(16, expf, reduce_halves), "avx2": Lanes(8, expf_avx2, reduce_hadd8),
         NEON: Lanes(4, expf_avx2, reduce_pairs, reduce_pairs, half=True, tiny_f32=4, tiny_f16=8, inverse_d=True)}
LANES[I8MM] = LANES[NEON]._replace(llamafile=False)


_LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
_LIBM.expf.restype, _LIBM.expf.argtypes = ctypes.c_float, [ctypes.c_float]
_LIBM.logf.restype, _LIBM.logf.argtypes = ctypes.c_float, [ctypes.c_float]


@njit(cache=True)
def _gelu_table(x):  # [65536] f32 (every float16 value) -> ggml_gelu_f32 of each, in float32
    out = np.empty_like(x)
    c, a = np.float32(0.79788456080286535587989211986876), np.float32(0.044715)
    for i in range(len(x)):
        v = x[i]
        inner = np.float32(np.float64(a * v) * np.float64(v) + 1.0)  # GCC contracts 1 + (a x) x into one fma
        out[i] = np.float32(0.5) * v * (np.float32(1.0) + math.tanh(c * v * inner))
    return out


GELU_TABLE = None  # ggml_table_gelu_f16, built on first use


def gelu_table():
    """llama.cpp's GELU: a table of float16 results for every float16 input (GGML_GELU_FP16 in ggml-cpu/vec.h),
    each 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) in float32 with the C library's tanhf, rounded (every
    finite entry equal to the built library's ggml_table_gelu_f16)."""
    global GELU_TABLE
    if GELU_TABLE is None:
        with np.errstate(all="ignore"):
            GELU_TABLE = round_f16(_gelu_table(F16_TABLE))
    return GELU_TABLE


def gelu(x):  # [...] f32 -> [...]: ggml_vec_gelu_f32: 0 below -10, x above 10, else the table at float16(x)
    table = gelu_table()
    with np.errstate(over="ignore"):
        looked = table[x.astype(np.float16).view(np.uint16)]
    return np.where(x <= -10, np.float32(0), np.where(x >= 10, x, looked)).astype(np.float32)


@vectorize(["float32(float32)"], cache=True)
def tanhf(x):  # the C library's tanhf (Numba calls it for a float32): llama.cpp's ggml_vec_tanh_f32
    return math.tanh(x)


def softcap(x, cap):  # [...] f32 -> [...]: llama.cpp's gemma3 graph: scale by float32(1 / cap), tanhf, scale by cap
    xp = array_module(x)
    y = x * np.float32(1.0 / cap)
    return (tanhf(y) if xp is np else xp.tanh(y)) * np.float32(cap)  # cupy: CUDA's tanhf, not the C library's


def geglu(gate, up):  # [T, F], [T, F] -> [T, F]: ggml_vec_geglu_f32, gelu(gate) * up
    return gelu(gate) * up


def swiglu(gate, up, path=AVX512):  # [T, F], [T, F] -> [T, F]: ggml_vec_swiglu_f32, silu(gate) * up
    return silu(gate, path) * up


def libm_expf(x):  # [...] f32 -> [...] f32: the C library's expf, value by value (it is not correctly rounded)
    f = _LIBM.expf
    return np.array([f(v) for v in x.ravel().tolist()], np.float32).reshape(x.shape)


def lanes_expf(x, path):  # [..., n] f32 -> [..., n]: the path's ggml_v_expf on whole vectors, libm's on the rest
    lanes = LANES[path]
    body = x.shape[-1] - x.shape[-1] % lanes.width
    if body == x.shape[-1]:  # every model's feed-forward width; the array stays in its module (cupy)
        return lanes.expf(x)
    return np.concatenate([lanes.expf(x[..., :body]), libm_expf(x[..., body:])], axis=-1)


def silu(x, path=AVX512):  # [..., n] f32 -> [..., n]: ggml_vec_silu_f32, x / (1 + expf(-x)), a vector at a time
    return x / (np.float32(1) + lanes_expf(-x, path))


def softmax(x, path=AVX512):  # [..., n] f32 -> [..., n]: ggml's soft_max (no mask, scale 1), ggml_vec_soft_max_f32
    """Whole vectors (16 lanes, AVX2's 8): ggml_v_expf, each vector's sum in float32, accumulated in float64; the
    rest: the C library's expf, added one by one in float64; then every e times float32(1 / sum)."""
    w = LANES[path].width
    body = x.shape[-1] - x.shape[-1] % w
    e = lanes_expf(x - x.max(axis=-1, keepdims=True), path)
    total = LANES[path].hsum(e[..., :body].reshape(*e.shape[:-1], -1, w)).astype(np.float64).sum(axis=-1)
    for i in range(body, x.shape[-1]):
        total = total + e[..., i].astype(np.float64)
    return e * (1.0 / total)[..., None].astype(np.float32)


def attention_weights(kq, mask, scale, path=AVX512):  # [H, T, S], [T, S] -> [H, T, S]: ggml's soft_max of kq * scale
    """+ mask. x = kq * float32(scale) + mask; e = expf(x - max); the sum of e a vector at a time (each vector's
    sum in float32) accumulated in float64; e times float32(1 / sum). Rows are padded with zeros to whole vectors,
    as llama.cpp's masked padding is."""
    lanes = LANES[path]
    x = kq * np.float32(scale) + mask
    S = x.shape[-1]
    e = lanes.expf(x - x.max(axis=-1, keepdims=True))
    pad = np.zeros((*e.shape[:-1], -S % lanes.width), np.float32)
    groups = lanes.hsum(np.concatenate([e, pad], axis=-1).reshape(*e.shape[:-1], -1, lanes.width))
    inv = (1.0 / groups.astype(np.float64).sum(axis=-1, keepdims=True)).astype(np.float32)
    return e * inv


def f16_dots(a, b, tokens, padded, path=AVX512):  # [..., n] f32, [..., n] f32 (float16 values) -> [...]: sum
    """of a * b as ggml sums a float16 product of `tokens` tokens. Products of float16 values are exact in float32,
    so on x86 only the order of additions matters. With w the path's lanes (16; AVX2's 8): a batch of 2+ tokens
    (llamafile's tinyBLAS), lane l adding elements w c + l over c, then the vector's sum (halves). One token (or n
    not a multiple of w, which tinyBLAS declines): ggml_vec_dot_f16, 4 x w lanes per 4 w elements, lanes
    (0+2)+(1+3), GGML_F32_VEC_REDUCE's end, then the n % 4w leftovers added in float64, unless the row is `padded`:
    llama.cpp's KV view is 256 cells long, zeros past the keys in use, so the sums over S (kqv) fill whole lanes.
    ARM's float16 arithmetic sums in float16 instead (f16_dots_half)."""
    lanes = LANES[path]
    if lanes.half:
        many = lanes.llamafile and tokens >= lanes.tiny_f16 and (padded or a.shape[-1] % 8 == 0)
        return f16_dots_half(a, b, many, padded)
    n = a.shape[-1]
    many = lanes.llamafile and tokens >= lanes.tiny_f16 and (padded or n % lanes.width == 0)
    width = lanes.width if many else 4 * lanes.width
    body = n if many or padded else n - n % width
    p = a * b
    head = np.concatenate([p[..., :body], np.zeros((*p.shape[:-1], -body % width), np.float32)], axis=-1)
    chunks = head.reshape(*p.shape[:-1], -1, width)
    acc = chunks[..., 0, :] if body else np.zeros((*p.shape[:-1], width), np.float32)  # n < 4w: no whole vector
    for c in range(1, chunks.shape[-2]):
        acc = acc + chunks[..., c, :]
    if not many:
        acc = acc.reshape(*acc.shape[:-1], 4, lanes.width)
        acc = (acc[..., 0, :] + acc[..., 2, :]) + (acc[..., 1, :] + acc[..., 3, :])
    total = (lanes.hsum(acc) if many else lanes.reduce(acc)).astype(np.float64)
    for i in range(body, n):
        total = total + p[..., i]
    return total.astype(np.float32)


def fma_f16(a, b, c):  # [...] f32 (float16 values) -> a * b + c rounded once to float16, as ARM's vfmaq_f16
    """float64 holds a * b (22 bits) exactly, and a * b + c wherever the float16 rounding could depend on it."""
    return round_f16(a.astype(np.float64) * b + c)


def add_f16(a, b):  # [...] f32 (float16 values) -> a + b rounded to float16 (vaddq_f16; exact in float64)
    return round_f16(a.astype(np.float64) + b)


def f16_dots_half(a, b, many, padded):  # [..., n], [..., n] f32 (float16 values) -> [...]: ARM's float16 sums
    """With __ARM_FEATURE_FP16_VECTOR_ARITHMETIC (Apple's chips, every ARM server core with dotprod) ggml sums a
    float16 product in float16 lanes, 8 a vector, each step one fused multiply-add rounded to float16. `many`
    (llamafile's tinyBLAS: 8+ tokens, n a multiple of 8): lane l over elements 8c + l, then its halves widened to
    float32 and added, then pairs (hsum). Else ggml_vec_dot_f16: 4 vectors over each 32 elements, added in float16
    (0+2), (1+3), then the two; widened and summed as tinyBLAS's; the n % 32 leftovers added in float64, unless
    `padded` (f16_dots)."""
    n = a.shape[-1]
    width = 8 if many else 32
    body = n if many or padded else n - n % width
    shape = np.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    a0, b0 = (np.pad(v[..., :body], [(0, 0)] * (v.ndim - 1) + [(0, -body % width)]) for v in (a, b))  # zeros past
    acc = np.zeros((*shape, width), np.float32)  # n (padded) leave every lane as it is
    for c in range(0, body, width):
        acc = fma_f16(a0[..., c:c + width], b0[..., c:c + width], acc)
    if not many:
        acc = acc.reshape(*shape, 4, 8)
        acc = add_f16(add_f16(acc[..., 0, :], acc[..., 2, :]), add_f16(acc[..., 1, :], acc[..., 3, :]))
    total = reduce_pairs(acc[..., :4] + acc[..., 4:]).astype(np.float64)
    for i in range(body, n):
        total = total + a[..., i] * b[..., i]
    return total.astype(np.float32)


def rope(x, cos, sin, interleaved, arm=False):  # [T, n, HD], [T, R/2], [T, R/2] -> [T, n, HD]
    """ggml's rotate_pairs: x0' = x0 cos - x1 sin, x1' = x0 sin + x1 cos, each with one fused multiply-add, as GCC
    compiles ggml's C++ (the products x1 sin and x1 cos rounded first). Pairs (2i, 2i+1) if `interleaved` (NORM),
    else (i, i + R/2) (NEOX). `arm`: GCC for aarch64 vectorizes NORM's loop, 4 pairs a step (ld2, fmls, fmla), and
    there x0' = fma(-x1, sin, x0 cos) with x0 cos rounded first; the pairs past the last whole 4 as above."""
    half = cos.shape[-1]
    pairs = (slice(0, 2 * half, 2), slice(1, 2 * half, 2)) if interleaved else (slice(0, half), slice(half, 2 * half))
    x0, x1 = x[..., pairs[0]], x[..., pairs[1]]
    c, s = cos[:, None, :], sin[:, None, :]
    out = x.copy()
    first = fma(x0, c, -(x1 * s))
    if arm and interleaved:
        vector = half - half % 4
        first[..., :vector] = fma(-x1[..., :vector], s[..., :vector], x0[..., :vector] * c[..., :vector])
    out[..., pairs[0]], out[..., pairs[1]] = first, fma(x0, s, x1 * c)
    return out


ROPE = {"interleaved": partial(rope, interleaved=True), "half": partial(rope, interleaved=False)}  # as layers.ROPE
ROPE_ARM = {"interleaved": partial(rope, interleaved=True, arm=True), "half": ROPE["half"]}


def attention_scores(q, k, path=AVX512):  # [T, H, HD], [KVH, S, HD] f32 (float16 values) -> [H, T, S]: kq
    T, H, HD = q.shape
    KVH, S, _ = k.shape
    qh = round_f16(q).transpose(1, 0, 2).reshape(KVH, H // KVH, T, 1, HD)
    return f16_dots(qh, k[:, None, None], T, False, path).reshape(H, T, S)


def attention_mix(p, v, path=AVX512):  # [H, T, S], [KVH, S, HD] f32 (float16 values) -> [T, H*HD]: kqv
    H, T, S = p.shape
    KVH, _, HD = v.shape
    ph = round_f16(p).reshape(KVH, H // KVH, T, 1, S)
    vt = v.transpose(0, 2, 1)[:, None, None]  # [KVH, 1, 1, HD, S]
    return f16_dots(ph, vt, T, True, path).reshape(H, T, HD).transpose(1, 0, 2).reshape(T, H * HD)


def cos_sin(angle):  # [n, m] f32 -> cos, sin [n, m] f32, as ggml's rope computes them (sincosf of float32 angles)
    """The C library's float32 cosf/sinf, which are not always correctly rounded (glibc: 48 of 7264 of SmolLM2's
    angles differ from cos in float64 rounded once); Numba's math.cos/sin on float32 call the same functions."""
    return _cos_sin(np.ascontiguousarray(angle, dtype=np.float32))


def rope_cos_sin(n_ctx, rope_dim, base, scale=1.0, attn_factor=1.0, freq_factors=None, yarn=None):  # -> cos, sin
    """cos, sin [n_ctx, R/2], the angles as ggml's rope computes them, in float32: theta_i = pos * s^i with s =
    float32(base^(-2/R)), multiplied in one factor at a time (ggml_rope_cache_init); at position 200 they differ from
    float64 angles by up to ~1e-5 radians. YaRN (rope_yarn): theta_interp * (1 - ramp) + theta_extrap * ramp, which
    GCC fuses wherever the build has FMA (every x86 and ARM build here): one rounding of theta_interp * (1 - ramp)
    plus the rounded second product (unfused, the AVX-512 build's Qcur_rope differs in the last bit). cos and sin as
    the C library's float32 functions give them (cos_sin)."""
    half = rope_dim // 2
    angle = np.empty((n_ctx, half), np.float32)  # half 0: no RoPE (GPT-2), empty tables
    if half:
        step = np.float32(base ** (-2.0 / rope_dim))
        angle[:, 0] = np.arange(n_ctx, dtype=np.float32)
        for i in range(1, half):
            angle[:, i] = angle[:, i - 1] * step
    if freq_factors is not None:
        angle = angle / freq_factors.astype(np.float32)
    interp = angle * np.float32(1.0 / scale)
    if yarn is not None:
        attn_factor = yarn_mscale_f32(scale, attn_factor)
        ramp = yarn_ramp(half, *yarn, np.float32)
        interp = (interp.astype(np.float64) * (np.float32(1) - ramp) + angle * ramp).astype(np.float32)
    cos, sin = cos_sin(interp)
    return cos * np.float32(attn_factor), sin * np.float32(attn_factor)


def logf(x):  # the C library's logf
    return np.float32(_LIBM.logf(np.float32(x)))


def yarn_mscale_f32(scale, attn_factor):  # -> float32: YaRN's cos/sin factor, as llama.cpp computes it
    """llama_context's yarn_attn_factor (get_mscale(factor) / (1 + 0.1 logf(factor)), times rope.scaling.attn_factor)
    times rope_yarn's 1 + 0.1 logf(1 / freq_scale), each step in float32: 1 + 0.1 ln(factor) up to its roundings."""
    f32 = np.float32
    freq_scale = f32(1) / f32(scale)
    factor = f32(1) / freq_scale
    mscale = f32(1) if factor <= 1 else f32(0.1) * logf(factor) + f32(1)
    mscale = mscale * (f32(1) / (f32(1) + f32(0.1) * logf(factor))) * f32(attn_factor)
    return mscale * (f32(1) + f32(0.1) * logf(f32(1) / freq_scale))


@njit(cache=True)
def _cos_sin(angle):
    c, s = np.empty_like(angle), np.empty_like(angle)
    for i in np.ndindex(angle.shape):
        c[i], s[i] = math.cos(angle[i]), math.sin(angle[i])
    return c, s


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
        Q6_K: 6 bits - 32, Q4_1/Q5_1/Q4_K/Q5_K: as stored, Q8_0: as stored);
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


class GgmlMatrix(WeightMatrix):
    """A quantized [N, K] matrix that multiplies as llama.cpp's CPU backend does. `x @ w.T` quantizes x to the
    type's vec-dot type and sums as ggml_vec_dot_* (or, `repack` and a type x86 repacks on the CPU `path`, as the
    repacked form's gemv/gemm); `w[rows]` dequantizes rows (llama.cpp's get_rows)."""

    ROWS_PER_PASS = 1 << 22  # lane sums per pass: the [K/4, T, N] sums of one pass stay under 16 MB

    def __init__(self, raw, qtype, shape, xp=np, repack=True, path=AVX512):
        self.qtype, self.shape, self.xp = qtype, tuple(shape), xp
        self.form = repacked(qtype, shape, path) if repack else None
        self.repacked = self.form is not None
        self.arm, self.llamafile = path.startswith("neon"), LANES[path].llamafile
        w = int_weights(raw, qtype, shape)
        group = GROUP.get(qtype, 32)
        N, K = shape
        self.group = group
        self.codes_t = xp.asarray(w.codes.astype(np.float32).reshape(N, K // group, group).transpose(1, 2, 0))
        self.w = IntWeights(qtype, None, *(None if a is None else xp.asarray(a) for a in w[2:]))

    def matmul(self, x):  # [T, K] f32 -> [T, N] f32
        """llama.cpp's path for this product: a repacked matrix's gemm on each four rows and gemv on the rest; a
        K-quant's tiled kernel for a batch of 8 or more rows (ggml-cpu/tiled); else one vec_dot per row and column."""
        N, K = self.shape
        T, xp = len(x), self.xp
        if self.repacked and VEC_DOT_TYPE[self.qtype] == Q8_K:  # the gemm's rows in fours, the rest one by one
            # (their activations differ in ties, their float steps in span; Q4_0's gemm and gemv take the same)
            four = T - T % 4
            parts = [(x[t:t + 4], "gemm") for t in range(0, four, 4)] + [(x[t:t + 1], "gemv") for t in range(four, T)]
            return xp.concatenate([self._matmul(p, path) for p, path in parts])
        if self.repacked and self.arm:  # ARM's gemm rows in fours, the rest through its gemv (activations alike)
            four = T - T % 4
            parts = ((x[:four], "gemm"), (x[four:], "gemv"))
            return xp.concatenate([self._matmul(p, path) for p, path in parts])
        if self.arm and not self.llamafile and not self.repacked and self.qtype in (QT.Q4_K, QT.Q6_K) and T > 1 \
                and mmla_pairs(N, T).any():
            raise RefllamaError(f"a {self.qtype.name} matrix not repacked, {T} tokens on the neon-i8mm path: its "
                                "two-row vec_dot (vmmlaq_s32) is not reproduced; run an odd number of tokens")
        two_rows = self.qtype in (QT.Q4_0, QT.Q4_1, QT.Q8_0)  # the types whose i8mm vec_dot takes two rows
        if self.arm and not self.llamafile and not self.repacked and two_rows and T > 1:
            pairs = mmla_pairs(N, T)  # i8mm: ggml's vec_dots, two rows at a time where the work chunk allows
            if pairs.any():
                step, parts = max(1, self.ROWS_PER_PASS // (N * K // 4)), []
                for t in range(0, T, step):
                    xs, ps = x[t:t + step], pairs[t:t + step]
                    two = self._matmul(xs, "mmla")
                    parts.append(two if ps.all() else xp.where(xp.asarray(ps), two, self._matmul(xs, "vec_dot")))
                return xp.concatenate(parts)
        if VEC_DOT_TYPE[self.qtype] == Q8_K:
            path = "tiled" if T >= 8 else "vec_dot"
        else:  # llamafile's tinyBLAS_Q0 for a batch (on x86 it sums as the vec_dot; ARM's has no Q5_0)
            tiny = self.llamafile and (not self.arm or self.qtype in (QT.Q4_0, QT.Q8_0))
            path = "tinyblas" if T > 1 and tiny else "vec_dot"
        step = max(1, self.ROWS_PER_PASS // (N * K // 4))
        return xp.concatenate([self._matmul(x[t:t + step], path) for t in range(0, T, step)])

    def matmul_id(self, x):  # [T, K] f32 -> [T, N] f32: llama.cpp's mul_mat_id for one expert's rows
        """A repacked K-quant's rows one at a time through the gemv (repack.cpp's forward_mul_mat_id), with their
        activations quantized row by row; any other matrix as matmul takes a batch of that many rows."""
        if self.repacked and VEC_DOT_TYPE[self.qtype] == Q8_K:
            return self.xp.concatenate([self._matmul(x[t:t + 1], "gemv") for t in range(len(x))])
        return self.matmul(x) if not self.arm else self._matmul(x, "vec_dot")  # x86's tinyBLAS sums as its vec_dot

    def _matmul(self, x, path):
        xp, vdt = self.xp, VEC_DOT_TYPE[self.qtype]
        x = xp.ascontiguousarray(x, dtype=np.float32)
        if vdt == Q8_K:
            xq, dx, bsums = quantize_q8_K(x, in_fours=path == "gemm" and not self.arm, fused=self.arm)
            if self.arm:
                return self._k_arm(xq, dx, bsums, path) if self.repacked else self._k_vec_dot_arm(xq, dx, bsums)
            if path == "vec_dot":
                return self._k_lanes(xq, dx, bsums)
            return self._k_steps(xq, dx, bsums, path)
        if vdt == Q8_1:  # no tinyBLAS and no repacked form: every product a vec_dot
            xq, dx, sx = quantize_q8_1(x, inverse_d=self.arm)
            if path == "mmla":
                return self._dot_blocks(xq, dx, False, sx)
            return self._dot_arm(xq, dx, False, sx) if self.arm else self._dot_lanes(xq, dx, sx)
        xq, _, dx = quantize_q8_0(x, inverse_d=self.arm)
        if self.repacked or path == "mmla":
            return self._dot_blocks(xq, dx, fused=path != "mmla" and not (path == "gemm" and self.form in UNFUSED_GEMM))
        return self._dot_arm(xq, dx, path == "tinyblas") if self.arm else self._dot_lanes(xq, dx, None)

    def _dot_blocks(self, xq, dx, fused=True, sx=None):  # blocks of 32 x Q8_0 or Q8_1 (sx) [T, K] -> [T, N]
        """x86's repacked ggml_gemv/gemm_q4_0_8x8_q8_0 (and ARM's q8_0_4x4): each block's exact integer sum, rounded
        to float32 once, acc = fma(isum, d_w * d_x, acc) block by block (the gemm's activations are Q8_0's own).
        Not `fused`: acc + isum * (d_w * d_x), product rounded first (ARM's 4x4 gemm and i8mm's two-row vec_dots:
        GCC keeps vmlaq_f32 unfused). Q8_1's offsets (Q4_1's two-row vec_dot): m_w s_x summed block by block apart,
        added at the end."""
        xp, w = self.xp, self.w
        sums = block_sums(xq, self.codes_t, 32)  # [K/32, T, N]
        acc = xp.zeros(sums.shape[1:], np.float32)
        summs = xp.zeros(sums.shape[1:], np.float32)
        for b in range(len(sums)):
            scale = w.d[None, :, b] * dx[:, b, None]
            acc = fma(sums[b], scale, acc) if fused else acc + sums[b] * scale
            if sx is not None:
                summs = summs + w.m[None, :, b] * sx[:, b, None]
        return acc if sx is None else acc + summs

    def _isum(self, sums, g):  # [K/group, T, N] block sums, a slice of groups -> [T, N] f32
        """The groups' code products times their sub-block scales: an exact integer (float64), rounded once."""
        return (sums[g].astype(np.float64) * self.w.sc.T[g, None, :]).sum(axis=0).astype(np.float32)

    def _msum(self, xs, g):  # [T, K/group'] x's sums of each min's sub-block (float64), a slice -> [T, N] f32
        """x's sums times the sub-blocks' mins: an exact integer, rounded once."""
        return (xs[:, g] @ self.w.m[:, g].T.astype(np.float64)).astype(np.float32)

    def _k_steps(self, xq, dx, bsums, path):  # Q8_K x [T, K] -> [T, N]
        """The K-quant kernels that sum exact integers over a step of sub-blocks, then take float steps: isum (the
        sub-blocks' scales times their code products) and msum (their mins times x's sums of 32), each rounded to
        float32 once.
          gemm, gemv (x86's repacked ggml_gemm/gemv_q4_K_8x8_q8_K, q2_K's; gemm steps of 64 values (Q2_K: 128), gemv
          steps of a block):
            acc = fma(isum, d_w * d_x, acc), accm = fma(msum, dmin_w * d_x, accm); the product acc - accm.
          tiled (ggml-cpu/tiled, its AVX-512 VNNI kernel; steps of a block):
            r = fma(-dmin_w, msum, isum * d_w), acc = fma(r, d_x, acc) (GCC contracts its multiply and add)."""
        xp, w = self.xp, self.w
        T, N = len(xq), self.shape[0]
        span = GEMM_STEP[self.qtype] if path == "gemm" else 8  # sub-blocks of 32 (or pairs of 16) per float step
        sums = block_sums(xq, self.codes_t, self.group)  # [K/group, T, N]
        per = 32 // self.group  # sub-blocks per 32
        xsums = bsums.reshape(T, -1, 2 // per).sum(axis=-1).astype(np.float64)  # [T, K/group]: x's sums of a sub-block
        acc, accm = xp.zeros((T, N), np.float32), xp.zeros((T, N), np.float32)
        for j in range(0, len(sums) // per, span):
            g, B = slice(j * per, (j + span) * per), j // 8
            isum = self._isum(sums, g)  # [T, N]
            msum = None if w.dmin is None else self._msum(xsums, g)
            if path == "tiled":
                r = isum * w.d[None, :, B]
                if msum is not None:
                    r = fma(-w.dmin[None, :, B], msum, r)
                acc = fma(r, dx[:, B, None], acc)
            else:
                acc = fma(isum, w.d[None, :, B] * dx[:, B, None], acc)
                accm = fma(msum, w.dmin[None, :, B] * dx[:, B, None], accm)
        return acc - accm

    def _k_arm(self, xq, dx, bsums, path):  # Q8_K x [T, K] -> [T, N]: ARM's repacked K-quant forms
        """ggml_gemv/gemm_q4_K_8x4_q8_K and the others of ARM_K_FORMS: exact integer sums over a step of values
        (Q6_K's -32 taken off through x's sums), each rounded to float32 once and added fused or not; Q4_K's and
        Q5_K's mins, msum (x's sums of 32 times each sub-block's min), taken off unfused where the form does."""
        xp, w = self.xp, self.w
        T, N = len(xq), self.shape[0]
        step, fused, when = ARM_K_FORMS[self.form, path]
        sums = block_sums(xq, self.codes_t, self.group)  # [K/group, T, N]
        xsums = bsums.reshape(T, -1, 2).sum(axis=-1).astype(np.float64)  # [T, K/32]: x's sums of 32
        acc = xp.zeros((T, N), np.float32)

        def mins(B, subs):  # the mins of block B's sub-blocks of 32 `subs`, times dmin_w d_x (rounded)
            return self._msum(xsums, subs) * (w.dmin[None, :, B] * dx[:, B, None])

        per, span = 256 // self.group, step // self.group  # a block's groups, a step's
        for B in range(len(sums) // per):
            scale = w.d[None, :, B] * dx[:, B, None]
            if when == "first":
                acc = acc - mins(B, slice(8 * B, 8 * B + 8))
            for j in range(B * per, (B + 1) * per, span):
                isum = self._isum(sums, slice(j, j + span))
                acc = fma(isum, scale, acc) if fused else acc + isum * scale
                end = (j + span) * self.group // 32  # sub-blocks of 32 summed so far
                if when == "each" and end % 2 == 0:
                    acc = acc - mins(B, slice(end - 2, end))
            if when == "after":
                acc = acc - mins(B, slice(8 * B, 8 * B + 8))
        return acc

    def _k_vec_dot_arm(self, xq, dx, bsums):  # Q8_K x [T, K] -> [T, N]: ARM's ggml_vec_dot_q*_K_q8_K (NEON)
        """A block's code products and its mins' products are exact integers (isum, msum); the float steps, as the
        build's code has them (d = d_w d_x, dmin = dmin_w d_x): Q2_K sum = fma(-dmin, msum, sum), then fma(isum, d,
        sum); Q3_K and Q6_K fma(isum, d, sum); Q4_K sum - msum dmin fused, then fma(isum, d, sum); Q5_K
        sum + fma(isum, d, -(msum dmin))."""
        xp, w = self.xp, self.w
        T, N = len(xq), self.shape[0]
        sums = block_sums(xq, self.codes_t, self.group)  # [K/group, T, N]
        xs = bsums.reshape(T, -1, self.group // 16).sum(axis=-1).astype(np.float64)  # [T, K/group]: x's group sums
        per = 256 // self.group
        acc = xp.zeros((T, N), np.float32)
        for B in range(len(sums) // per):
            g = slice(B * per, (B + 1) * per)
            d = w.d[None, :, B] * dx[:, B, None]
            isum = self._isum(sums, g)
            if w.dmin is None:  # Q3_K, Q6_K
                acc = fma(isum, d, acc)
                continue
            msum = self._msum(xs, g)
            dmin = w.dmin[None, :, B] * dx[:, B, None]
            if self.qtype == QT.Q5_K:
                acc = acc + fma(isum, d, -(msum * dmin))
            else:  # Q2_K, Q4_K
                acc = fma(isum, d, fma(-dmin, msum, acc))
        return acc

    def _k_lanes(self, xq, dx, bsums):  # Q8_K x [T, K] -> [T, N]
        """x86's ggml_vec_dot_q4_K_q8_K (q5_K, q6_K), step by step: element e of each block of 256 adds into int32
        lane (e % 32) // 4, times its sub-block's scale (Q6_K: its codes 0..63, and each lane l takes back 32 *
        scale * x's sums of the sub-blocks 2l and 2l + 1); per block acc = fma(d_x * d_w, lane, acc) in 8 lanes.
        The mins: Q4_K fma(-d_x * dmin_w, pair sums, accm) in 4 lanes, pairs k = sub-blocks 2k and 2k + 1; Q5_K
        one fma of the whole sum; Q2_K, before the block's codes, into the same 8 lanes, lane l the sub-blocks of 16
        2l and 2l + 1 (Q3_K: none). Then the 8 lanes added as hsum_float_8, plus the mins' (0 + 2) + (1 + 3)."""
        xp, w, qtype = self.xp, self.w, self.qtype
        T, N = len(xq), self.shape[0]
        chunks = block_sums(xq, self.codes_t.reshape(-1, 4, N), 4)  # [K/4, T, N]: chunk c of block B is 64B + c
        per_scale = self.group // 4  # chunks per sub-block scale
        acc = xp.zeros((8, T, N), np.float32)
        accm = xp.zeros((4, T, N) if qtype == QT.Q4_K else (T, N), np.float32)
        for B in range(len(chunks) // 64):
            c = np.arange(64)
            sc = w.sc.T[B * 256 // self.group + c // per_scale].astype(np.float64)  # [64, N]: each chunk's scale
            lane = (chunks[64 * B:64 * B + 64].astype(np.float64) * sc[:, None, :]).reshape(8, 8, T, N).sum(axis=0)
            if qtype == QT.Q6_K:  # codes as stored, 0..63: + 32 * sc * x per chunk, - 32 * sc * x per lane's pair
                x4 = xq[:, 256 * B:256 * B + 256].reshape(T, 64, 4).sum(axis=-1, dtype=np.int64).astype(np.float64)
                lane += 32 * (x4.T[:, :, None] * sc[:, None, :]).reshape(8, 8, T, N).sum(axis=0)
                bs = bsums[:, 16 * B:16 * B + 16].astype(np.float64)  # [T, 16]
                lane -= 32 * (bs[:, None, :] * sc[::4].T[None]).reshape(T, N, 8, 2).sum(axis=-1).transpose(2, 0, 1)
            if qtype == QT.Q2_K:
                prod = bsums[:, None, 16 * B:16 * B + 16].astype(np.float64) * w.m[None, :, 16 * B:16 * B + 16]
                acc = fma(-dx[None, :, B, None] * w.dmin[None, None, :, B],
                          prod.reshape(T, N, 8, 2).sum(axis=-1).transpose(2, 0, 1).astype(np.float32), acc)
            acc = fma(dx[None, :, B, None] * w.d[None, None, :, B], lane.astype(np.float32), acc)
            if w.dmin is not None and qtype != QT.Q2_K:
                xsum = bsums[:, 16 * B:16 * B + 16].reshape(T, 8, 2).sum(axis=-1).astype(np.float64)  # [T, 8]
                prod = xsum[:, None, :] * w.m[None, :, 8 * B:8 * B + 8].astype(np.float64)  # [T, N, 8]
                dmin = -dx[:, B, None] * w.dmin[None, :, B]
                if qtype == QT.Q4_K:
                    accm = fma(dmin, prod.reshape(T, N, 4, 2).sum(axis=-1).transpose(2, 0, 1).astype(np.float32), accm)
                else:
                    accm = fma(dmin, prod.sum(axis=-1).astype(np.float32), accm)
        r4 = acc[4:] + acc[:4]  # hsum_float_8
        out = (r4[0] + r4[2]) + (r4[1] + r4[3])
        if qtype == QT.Q4_K:
            return out + ((accm[0] + accm[2]) + (accm[1] + accm[3]))
        return out + accm if qtype == QT.Q5_K else out

    def _dot_lanes(self, xq, dx, sx):  # blocks of 32 x Q8_0 or Q8_1 (sx), in ggml's x86 order: [T, K] -> [T, N]
        """ggml_vec_dot_q4_1_q8_1 (and q4_0, q5_0, q5_1, q8_0 x q8_0) on x86, step by step, so that the result is
        llama.cpp's to the bit: each block's 32 products are summed in 8 lanes of 4 (vpdpbusd); each lane
        accumulates fma(d_w * d_x, lane, acc) over the blocks, Q8_1's offsets fma(m_w, s_x, summs); the 8 lanes
        are added as ((0+4)+(2+6))+((1+5)+(3+7)), then summs."""
        xp, w = self.xp, self.w
        T, N = len(xq), self.shape[0]
        lanes = block_sums(xq, self.codes_t.reshape(-1, 4, N), 4)  # [K/4, T, N]: lane j of block b is 8b + j
        acc = xp.zeros((8, T, N), np.float32)
        summs = xp.zeros((T, N), np.float32)
        for b in range(len(lanes) // 8):
            acc = fma(w.d[None, :, b] * dx[:, b, None], lanes[8 * b:8 * b + 8], acc)  # d_w * d_x in float32
            if sx is not None:
                summs = fma(w.m[None, :, b], sx[:, b, None], summs)
        r4 = acc[4:] + acc[:4]  # hsum_float_8: high half + low half, then pairs, then the two left
        return ((r4[0] + r4[2]) + (r4[1] + r4[3])) + summs

    def _dot_arm(self, xq, dx, tiny, sx=None):  # blocks of 32 x Q8_0 or Q8_1 (sx), ARM's order: [T, K] -> [T, N]
        """Lane j of a block sums its products 4j..4j+3 and 16+4j..16+4j+3 (two vdotq_s32), exactly; each lane
        acc + lane * (d_w * d_x), the product rounded first (GCC keeps vmlaq_n_f32 unfused). `tiny` (llamafile's
        tinyBLAS_Q0_ARM, a batch): one vector over every block, its lanes summed in pairs. Else
        ggml_vec_dot_q8_0_q8_0: even and odd blocks in two vectors, each summed in pairs, then added; an odd last
        block's integer sum fma'd onto that (the build's code: fmul and fadd in the loop, fmadd after it; Q4_0's
        (isum d_w) d_x, isum d_w rounded first). Q8_1's
        offsets (ggml_vec_dot_q4_1_q8_1): summs + fma(m_w s_x of the even block, round(that of the odd one)) a pair,
        added after the lanes; an odd last block adds fma(d_w d_x, isum, round(m_w s_x)) after that."""
        xp, w = self.xp, self.w
        T, N = len(xq), self.shape[0]
        groups = block_sums(xq, self.codes_t.reshape(-1, 4, N), 4).reshape(-1, 8, T, N)  # [K/32, 8, T, N]
        lanes = (groups[:, :4] + groups[:, 4:]).transpose(0, 2, 3, 1)  # [K/32, T, N, 4]
        scale = (w.d.T[:, None, :] * dx.T[:, :, None])[..., None]  # [K/32, T, N, 1]: d_w * d_x in float32
        nb = len(lanes)
        if tiny:
            acc = xp.zeros((T, N, 4), np.float32)
            for b in range(nb):
                acc = acc + lanes[b] * scale[b]
            return reduce_pairs(acc)
        acc = [xp.zeros((T, N, 4), np.float32), xp.zeros((T, N, 4), np.float32)]
        summs = xp.zeros((T, N), np.float32)
        offset = None if sx is None else w.m.T[:, None, :] * sx.T[:, :, None]  # [K/32, T, N]: m_w s_x, exact
        for b in range(nb - nb % 2):
            acc[b % 2] = acc[b % 2] + lanes[b] * scale[b]
            if offset is not None and b % 2:
                summs = summs + fma(w.m.T[b - 1][None, :], sx.T[b - 1][:, None], offset[b])
        total = reduce_pairs(acc[0]) + reduce_pairs(acc[1])
        if offset is not None:
            total = total + summs
        if nb % 2 and offset is not None:
            return total + fma(scale[-1, ..., 0], lanes[-1].sum(axis=-1), offset[-1])
        if nb % 2 and self.qtype == QT.Q4_0:  # its C: sumf += sumi * d_w * d_x
            return fma(lanes[-1].sum(axis=-1) * w.d.T[-1][None, :], dx.T[-1][:, None], total)
        return fma(lanes[-1].sum(axis=-1), scale[-1, ..., 0], total) if nb % 2 else total

    def __getitem__(self, rows):  # [T] -> [T, K] f32, dequantized
        N, K = self.shape
        rows = self.xp.asarray(rows).reshape(-1)
        codes = self.codes_t[:, :, rows].transpose(2, 0, 1).reshape(len(rows), K).astype(np.int8)
        sub = IntWeights(self.qtype, codes, *(None if a is None else a[rows] for a in self.w[2:]))
        return dequantize(sub)


class F16Matrix(WeightMatrix):
    """A float16 matrix: llama.cpp rounds the float32 operand to float16 and sums the products in float32."""

    def __init__(self, w, xp=np):
        self.w = xp.asarray(w, dtype=np.float16)
        self.shape = self.w.shape

    def matmul(self, x):
        return round_f16(x) @ self.w.T.astype(np.float32)

    def __getitem__(self, rows):
        return self.w[rows].astype(np.float32)


def id_product(rows, w):  # [n, K], an expert's matrix -> [n, N]: as llama.cpp's mul_mat_id multiplies them
    return w.matmul_id(rows) if hasattr(w, "matmul_id") else linear(rows, w)


def f32_dots(x, w, path=AVX512):  # [T, K] f32, [N, K] f32 -> [T, N]: x @ w.T summed as llama.cpp sums an F32
    """matrix's products. With w the path's lanes (16; AVX2's 8): a batch (2+ tokens, K a multiple of w, N of 4):
    llamafile's tinyBLAS, lane l a fused multiply-add over elements w c + l, then the vector's sum (halves). One
    token (or a shape tinyBLAS declines): ggml_vec_dot_f32, 4 x w lanes of FMAs per 4 w elements, lanes
    (0+2)+(1+3), GGML_F32_VEC_REDUCE's end, then the K % 4w leftovers' products added one by one in float32."""
    lanes = LANES[path]
    T, K = x.shape
    many = lanes.llamafile and T >= lanes.tiny_f32 and K % lanes.width == 0 and len(w) % 4 == 0
    width = lanes.width if many else 4 * lanes.width
    body = K if many else K - K % width
    out = np.empty((T, len(w)), np.float32)
    step = max(1, (1 << 22) // (T * width))  # rows a pass: the lanes of T x step products at a time
    for a in range(0, len(w), step):
        wa = w[a:a + step]
        acc = np.zeros((T, len(wa), width), np.float32)
        for c in range(0, body, width):
            acc = fma(x[:, None, c:c + width], wa[None, :, c:c + width], acc)
        if not many:
            acc = acc.reshape(T, len(wa), 4, lanes.width)
            acc = (acc[..., 0, :] + acc[..., 2, :]) + (acc[..., 1, :] + acc[..., 3, :])
        total = lanes.hsum(acc) if many else lanes.reduce(acc)
        for i in range(body, K):
            total = total + x[:, None, i] * wa[None, :, i]
        out[:, a:a + step] = total
    return out


class F32Matrix(WeightMatrix):
    """A float32 matrix (a router, an F32 file's matrices): its products summed in llama.cpp's order on a CPU path
    (f32_dots)."""

    def __init__(self, w, path=AVX512):
        self.w, self.path = np.asarray(w, dtype=np.float32), path
        self.shape = self.w.shape

    def matmul(self, x):
        return f32_dots(np.asarray(x, dtype=np.float32).reshape(-1, self.shape[1]), self.w, self.path)

    def __getitem__(self, rows):
        return self.w[rows]


class GgmlPlacement(Placement):
    """Weights for `numerics="ggml"` on numpy (or cupy): quantized matrices as GgmlMatrix, float16 ones as
    F16Matrix, float32 ones as F32Matrix (numpy), vectors as they are."""

    keep = EMULATED | {QT.F16}

    def __init__(self, xp=np, repack=True, path=AVX512):
        super().__init__(xp)
        self.repack, self.path = repack, path

    def prepare(self, qtypes, cfg):
        keep = (self.keep | {QT.F32}) if self.path not in TYPES else {QT[name] for name in TYPES[self.path]}
        unsupported = {t for t in qtypes if t not in keep}
        if unsupported:
            names = ", ".join(sorted(t.name for t in unsupported))
            on = f" on the {self.path} path" if self.path in TYPES else ""
            raise RefllamaError(f"numerics 'ggml' has no emulation of {names} matrices{on} (it has "
                                f"{', '.join(sorted(t.name for t in keep))})")

    def __call__(self, a):
        if isinstance(a, QuantizedTensor):
            if a.qtype == QT.F16:
                from gguf.quants import dequantize as deq

                return F16Matrix(deq(a.raw, a.qtype).reshape(a.shape), self.xp)
            return GgmlMatrix(a.raw, a.qtype, a.shape, self.xp, self.repack, self.path)
        if getattr(a, "ndim", 0) == 2 and self.xp is np:
            return F32Matrix(a, self.path)
        return super().__call__(a)


# numerics "ggml" on numpy (and cupy): RMSNorm is refllama.layers' own, which sums as ggml does
OPS = Ops(rms_norm=rms_norm, rope=ROPE, rope_cos_sin=rope_cos_sin, attention_scores=attention_scores,
          attention_weights=attention_weights, attention_mix=attention_mix, swiglu=swiglu, gelu=gelu, geglu=geglu,
          softcap=softcap, kv_f16=True, q_first=True, softmax=softmax,
          silu=silu, mul_mat_id=partial(mul_mat_id, product=id_product))


def path_ops(path):
    """OPS on a CPU path (LANES): its float steps' lanes and expf."""
    steps = (attention_scores, attention_weights, attention_mix, swiglu, softmax, silu)
    if path == AVX512:
        return OPS
    return OPS._replace(**{f.__name__: partial(f, path=path) for f in steps},
                        **({"rope": ROPE_ARM} if path.startswith("neon") else {}))
