"""llama.cpp's float steps on its CPU paths (refllama.numerics.cpu_paths), written out in NumPy: fused
multiply-adds, ggml_v_expf's forms, how a path's vectors sum their lanes (LANES), the activations (SiLU, GELU's
float16 table, soft-caps), softmax, RoPE's cos/sin and rotation, the attention's float16 products, and an F32
matrix's sums. Each takes `path` where the paths differ; refllama.numerics.ggml_kernels does the same in Numba.
"""

import ctypes
import ctypes.util
import math
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import numpy as np
from numba import njit, vectorize

from ..layers import rms_norm, yarn_ramp
from ..xp import array_module
from . import ggml_tables
from .ggml_tables import F16_TABLE, round_f16

AVX512 = "avx512-vnni"  # the CPU path a call takes unless told
NEON, I8MM = "neon-dotprod", "neon-i8mm"  # ARM's with dotprod and float16 arithmetic, and with i8mm too


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
    tinyBLAS at all (ggml-cpu.c leaves it out of ARM builds with i8mm or SVE: every product is a vec_dot); whether
    the compiler fused SSM_CONV's `sumf += s * c` into multiply-adds (measured: the AVX-512 build's do, AVX2's not)."""

    width: int
    expf: Callable
    reduce: Callable
    hsum: Callable = reduce_halves
    half: bool = False
    tiny_f32: int = 2
    tiny_f16: int = 2
    inverse_d: bool = False
    llamafile: bool = True
    conv_fused: bool = True


LANES = {AVX512: Lanes(16, expf, reduce_halves), "avx2": Lanes(8, expf_avx2, reduce_hadd8, conv_fused=False),
         NEON: Lanes(4, expf_avx2, reduce_pairs, reduce_pairs, half=True, tiny_f32=4, tiny_f16=8, inverse_d=True)}
LANES[I8MM] = LANES[NEON]._replace(llamafile=False)


_LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
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


@vectorize(["float32(float32)"], cache=True)
def libm_expf(x):  # [...] f32 -> [...] f32: the C library's expf (Numba calls it for a float32; not correctly rounded)
    return math.exp(x)


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


def layer_norm(x, w, b, eps, path=AVX512):  # [T, D], [D], [D] -> [T, D]: ggml_norm, then ggml_mul by w, ggml_add b
    """ggml_compute_forward_norm_f32: the mean a float64 sum one value at a time, divided in float32; y = x - mean;
    the variance each vector's squares summed in float32 (the path's lanes, ggml_vec_cvar_f32), the vectors and
    then the leftovers accumulated in float64, divided by n in float64 and rounded; y times 1 / sqrtf(var + eps)."""
    lanes = LANES[path]
    n = x.shape[-1]
    mean = np.cumsum(x.astype(np.float64), axis=-1)[..., -1:].astype(np.float32) / np.float32(n)  # [T, 1]
    y = x - mean
    body = n - n % lanes.width
    sq = y * y
    total = lanes.hsum(sq[..., :body].reshape(*sq.shape[:-1], -1, lanes.width)).astype(np.float64)
    total = np.cumsum(np.concatenate([total, sq[..., body:].astype(np.float64)], axis=-1), axis=-1)[..., -1:]
    variance = (total / n).astype(np.float32)
    return y * (np.float32(1) / np.sqrt(variance + np.float32(eps))) * w + b


def attention_weights(kq, mask, scale, sinks=None, path=AVX512):  # [H, T, S], [T, S], [H] -> [H, T, S]
    """ggml's soft_max of kq * scale + mask. x = kq * float32(scale) + mask; e = expf(x - max); the sum of e a vector
    at a time (each vector's sum in float32) accumulated in float64; e times float32(1 / sum). Rows are padded with
    zeros to whole vectors, as llama.cpp's masked padding is. `sinks` (gpt-oss's): the max taken over the row and
    the head's sink, the sink's expf (the C library's) added to the float64 sum."""
    lanes = LANES[path]
    x = kq * np.float32(scale) + mask
    S = x.shape[-1]
    top = x.max(axis=-1, keepdims=True)
    if sinks is not None:
        top = np.maximum(top, sinks.astype(np.float32)[:, None, None])
    e = lanes.expf(x - top)
    pad = np.zeros((*e.shape[:-1], -S % lanes.width), np.float32)
    groups = lanes.hsum(np.concatenate([e, pad], axis=-1).reshape(*e.shape[:-1], -1, lanes.width))
    total = groups.astype(np.float64).sum(axis=-1, keepdims=True)
    if sinks is not None:
        total = total + libm_expf(sinks.astype(np.float32)[:, None, None] - top).astype(np.float64)
    return e * (1.0 / total).astype(np.float32)


def swiglu_oai(gate, up, alpha, limit):  # [..., F], [..., F] -> [..., F]: ggml_compute_forward_swiglu_oai_f32
    """x = min(gate, limit), y = clamp(up, -limit, limit), x / (1 + expf(alpha * -x)) * (y + 1), in float32, expf the
    C library's (CUDA's on cupy)."""
    xp = array_module(gate)
    x = xp.minimum(gate, np.float32(limit))
    y = xp.clip(up, np.float32(-limit), np.float32(limit))
    z = np.float32(alpha) * -x
    return x / (np.float32(1) + (libm_expf(z) if xp is np else xp.exp(z))) * (y + np.float32(1))


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


def rope_cos_sin(n_ctx, rope_dim, base, scale=1.0, attn_factor=1.0, freq_factors=None, yarn=None,
                 mscale_in_kq=False):  # -> cos, sin
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
        attn_factor = yarn_mscale_f32(scale, attn_factor, mscale_in_kq)
        ramp = yarn_ramp(half, *yarn, np.float32)
        interp = (interp.astype(np.float64) * (np.float32(1) - ramp) + angle * ramp).astype(np.float32)
    cos, sin = cos_sin(interp)
    return cos * np.float32(attn_factor), sin * np.float32(attn_factor)


def logf(x):  # the C library's logf
    return np.float32(_LIBM.logf(np.float32(x)))


def yarn_mscale_f32(scale, attn_factor, mscale_in_kq=False):  # -> float32: YaRN's cos/sin factor, as llama.cpp
    """llama_context's yarn_attn_factor (get_mscale(factor) / (1 + 0.1 logf(factor)), times rope.scaling.attn_factor;
    DeepSeek's, `mscale_in_kq`: 1 / (1 + 0.1 logf(factor)), its mscale in the softmax scale) times rope_yarn's
    1 + 0.1 logf(1 / freq_scale), each step in float32: 1 + 0.1 ln(factor) (or 1) up to its roundings."""
    f32 = np.float32
    freq_scale = f32(1) / f32(scale)
    factor = f32(1) / freq_scale
    mscale = f32(1) if factor <= 1 or mscale_in_kq else f32(0.1) * logf(factor) + f32(1)
    mscale = mscale * (f32(1) / (f32(1) + f32(0.1) * logf(factor))) * f32(attn_factor)
    return mscale * (f32(1) + f32(0.1) * logf(f32(1) / freq_scale))


@njit(cache=True)
def _cos_sin(angle):
    c, s = np.empty_like(angle), np.empty_like(angle)
    for i in np.ndindex(angle.shape):
        c[i], s[i] = math.cos(angle[i]), math.sin(angle[i])
    return c, s


def f32_dots(x, w, path=AVX512, batch=True):  # [T, K] f32, [N, K] f32 -> [T, N]: x @ w.T summed as llama.cpp sums
    """an F32 matrix's products. With w the path's lanes (16; AVX2's 8): a batch (2+ tokens, K a multiple of w, N of
    4): llamafile's tinyBLAS, lane l a fused multiply-add over elements w c + l, then the vector's sum (halves). One
    token (or a shape tinyBLAS declines, or not a `batch`: mul_mat_id's rows): ggml_vec_dot_f32, 4 x w lanes of FMAs
    per 4 w elements, lanes (0+2)+(1+3), GGML_F32_VEC_REDUCE's end, then the K % 4w leftovers' products added one by
    one in float32."""
    lanes = LANES[path]
    T, K = x.shape
    many = batch and lanes.llamafile and T >= lanes.tiny_f32 and K % lanes.width == 0 and len(w) % 4 == 0
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


@vectorize(["float32(float32)"], cache=True)
def libm_logf(x):  # [...] f32 -> [...] f32: the C library's logf (Numba calls it for a float32)
    return math.log(x)


def sigmoid(x):  # [...] f32 -> [...]: ggml's op_sigmoid, 1 / (1 + expf(-x)), the C library's expf
    return np.float32(1) / (np.float32(1) + libm_expf(-x))


def softplus(x):  # [...] f32 -> [...]: ggml's op_softplus, log(1 + expf(x)) by the C library, x itself past 20
    return np.where(x > 20, x, libm_logf(np.float32(1) + libm_expf(np.minimum(x, np.float32(20)))))


def l2_norm(x, eps):  # [..., n] f32 -> [..., n]: llama.cpp's build_gdn_l2_norm, rms_norm with eps / n, times 1/sqrt(n)
    n = np.float32(x.shape[-1])
    return rms_norm(x, np.float32(1), np.float32(eps) / n) * (np.float32(1) / np.sqrt(n))


def ssm_conv(x, state, w, path=AVX512):  # [T, C], [CK-1, C], [C, CK] -> y [T, C], state: ggml's SSM_CONV
    """Each channel's CK taps summed in order in float32, each step a fused multiply-add where the path's build
    contracts ggml's `sumf += s * c` (Lanes.conv_fused), a product then a sum where not."""
    K, T = w.shape[1], len(x)
    xs = np.concatenate([state, x], axis=0)  # [CK-1+T, C]
    y = np.zeros(x.shape, np.float32)
    for j in range(K):
        tap_j = np.broadcast_to(w[:, j], x.shape)
        y = fma(xs[j:j + T], tap_j, y) if LANES[path].conv_fused else y + xs[j:j + T] * tap_j
    return y, xs[T:]


def vec_dots(a, x, path=AVX512):  # [..., N, K] f32, [..., K] f32 -> [..., N]: ggml_vec_dot_f32 of each row with x
    """4 x w lanes of FMAs per 4 w elements (w the path's lanes), lanes (0+2)+(1+3), the path's reduction, then the
    K % 4w leftovers' products added one by one in float32 (as f32_dots sums one token)."""
    lanes = LANES[path]
    K, width = a.shape[-1], 4 * lanes.width
    body = K - K % width
    acc = np.zeros((*a.shape[:-1], width), np.float32)
    for c in range(0, body, width):
        acc = fma(a[..., c:c + width], x[..., None, c:c + width], acc)
    acc = acc.reshape(*acc.shape[:-1], 4, lanes.width)
    total = lanes.reduce((acc[..., 0, :] + acc[..., 2, :]) + (acc[..., 1, :] + acc[..., 3, :]))
    for i in range(body, K):
        total = total + a[..., i] * x[..., None, i]
    return total


def gated_delta_net(q, k, v, g, beta, state, path=AVX512):  # as refllama.layers.gated_delta_rule: ggml's op
    """GATED_DELTA_NET as ggml-cpu computes it, a token at a time for each v head: the state [H, dv, dk] times the C
    library's expf(g); delta = (v - vec_dot(S rows, k)) beta; S += delta k^T by ggml_vec_mad_f32 (fused
    multiply-adds); out = vec_dot(S rows, q) times float32(1 / sqrt(dk)) (q itself unscaled)."""
    scale = np.float32(1) / np.sqrt(np.float32(q.shape[-1]))
    out = np.empty_like(v)
    for t in range(len(q)):
        state = state * libm_expf(g[t])[:, None, None]
        delta = (v[t] - vec_dots(state, k[t], path)) * beta[t][:, None]  # [H, dv]
        state = fma(np.broadcast_to(k[t][:, None, :], state.shape), delta[:, :, None], state)
        out[t] = vec_dots(state, q[t], path) * scale
    return out, state
