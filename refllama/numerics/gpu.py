"""The GPU's own kernels (CUDA C, compiled by CuPy) for a decode step and for 16-bit weights, each beside its NumPy
mirror: the same arithmetic on NumPy arrays, written into the same output buffers. The mirrors are what the CPU
tests run (a decode step built from them is held to refllama.layers' forward); on a GPU each kernel is held to its
mirror (tests/test_gpu.py, tools/gpu_check.py). Hand-written because a decode step of one token is a few hundred
small launches that CuPy's array operations cannot fuse or put in a CUDA graph without allocating.

Shape letters as refllama.layers; QKV = (H + 2 KVH) HD, a layer's q, k and v projections side by side; R the
rotated dims of a head. `pos` and `token` are one-element int32 arrays on the device, so that a captured graph
reads the step's position and token rather than baking them in.
"""

import numpy as np

from .. import layers
from ..formats.ggml_types import BLOCK_SIZES, GGMLType, QuantizedTensor
from ..xp import Placement, array_module, to_numpy
from .matrices import SCRATCH_VALUES, Scratch, WeightMatrix

WARPS = 8  # a gemv block's warps, one output row each
HALF = {GGMLType.F16: "f16", GGMLType.BF16: "bf16"}  # the 16-bit types kept as stored on the GPU
QUANT = {t: t.name.lower() for t in GGMLType if BLOCK_SIZES[t][0] >= 32}  # blocks of 32 or 256 values
STORED = {**HALF, **QUANT}  # every type a matrix stays in on the GPU, by its kernels' name
KIND = {kind: qtype for qtype, kind in STORED.items()}

# GGUF's quantized blocks, 8 values at a time: dq_<type>(block, g, j0, v) writes values j0 .. j0 + 7 of the block's
# group g of 32 (j0 a multiple of 8) into v[8], as gguf-py's dequantize computes them (each product and sum rounded
# on its own: the _rn intrinsics, which are never fused into a multiply-add). Eight lanes share a group, so that a
# warp's loads of codes and of x are contiguous. Plain C but for f16, __device__, __forceinline__ and the
# intrinsics, so the host's C compiler runs it too (tests/test_gpu.py). Layouts: ggml-common.h's block_<type>.
DEQUANT = r"""
#define DQ(T) __device__ __forceinline__ void dq_##T(const unsigned char* b, int g, int j0, float* v)
__device__ __forceinline__ unsigned int u16at(const unsigned char* p) { return p[0] | (p[1] << 8); }
__device__ __forceinline__ unsigned int u32at(const unsigned char* p) { return u16at(p) | (u16at(p + 2) << 16); }
// 32-value blocks: d (f16), [m (f16)], [qh (32 bits)], qs (the codes of j and j + 16 in a byte's two halves), or
// Q8_0's int8 codes
__device__ __forceinline__ int nibble(const unsigned char* qs, int j) { return j < 16 ? qs[j] & 15 : qs[j - 16] >> 4; }
DQ(q4_0) {
    float d = f16(u16at(b));
    _Pragma("unroll") for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(d, (float)(nibble(b + 2, j0 + i) - 8));
}
DQ(q4_1) {
    float d = f16(u16at(b)), m = f16(u16at(b + 2));
    _Pragma("unroll") for (int i = 0; i < 8; ++i) v[i] = __fadd_rn(__fmul_rn(d, (float)nibble(b + 4, j0 + i)), m);
}
DQ(q5_0) {
    float d = f16(u16at(b));
    unsigned int qh = u32at(b + 2);
    _Pragma("unroll") for (int i = 0; i < 8; ++i) {
        int j = j0 + i;
        v[i] = __fmul_rn(d, (float)((nibble(b + 6, j) | (int)((qh >> j) & 1) << 4) - 16));
    }
}
DQ(q5_1) {
    float d = f16(u16at(b)), m = f16(u16at(b + 2));
    unsigned int qh = u32at(b + 4);
    _Pragma("unroll") for (int i = 0; i < 8; ++i) {
        int j = j0 + i;
        v[i] = __fadd_rn(__fmul_rn(d, (float)(nibble(b + 8, j) | (int)((qh >> j) & 1) << 4)), m);
    }
}
DQ(q8_0) {
    float d = f16(u16at(b));
    _Pragma("unroll") for (int i = 0; i < 8; ++i) v[i] = __fmul_rn((float)(signed char)b[2 + j0 + i], d);
}
// 256-value blocks, 8 groups of 32 (Q2_K, Q3_K, Q6_K: a scale per 16 values, s)
DQ(q2_k) {  // scales, qs, d, dmin
    int s = b[2 * g + j0 / 16], shift = 2 * (g % 4);
    float dl = __fmul_rn(f16(u16at(b + 80)), (float)(s & 15)), ml = __fmul_rn(f16(u16at(b + 82)), (float)(s >> 4));
    const unsigned char* q = b + 16 + (g / 4) * 32 + j0;
    _Pragma("unroll") for (int i = 0; i < 8; ++i) v[i] = __fsub_rn(__fmul_rn(dl, (float)((q[i] >> shift) & 3)), ml);
}
DQ(q3_k) {  // hmask, qs, scales, d
    const unsigned char *q = b + 32 + (g / 4) * 32 + j0, *sc = b + 96;
    int s = 2 * g + j0 / 16, shift = 2 * (g % 4);
    int scale = ((s < 8 ? sc[s] & 15 : sc[s - 8] >> 4) | ((sc[8 + s % 4] >> (2 * (s / 4))) & 3) << 4) - 32;
    float dl = __fmul_rn(f16(u16at(b + 108)), (float)scale);
    _Pragma("unroll") for (int i = 0; i < 8; ++i)
        v[i] = __fmul_rn(dl, (float)(((q[i] >> shift) & 3) - ((((b[j0 + i] >> g) & 1) ^ 1) << 2)));
}
// Q4_K/Q5_K's 6-bit scale and min of group g (get_scale_min_k4), each times its float16 factor
__device__ __forceinline__ void scale_min(const unsigned char* b, int g, float* dl, float* ml) {
    const unsigned char* s = b + 4;
    int sc = g < 4 ? s[g] & 63 : (s[g + 4] & 15) | ((s[g - 4] >> 6) << 4);
    int m = g < 4 ? s[g + 4] & 63 : (s[g + 4] >> 4) | ((s[g] >> 6) << 4);
    *dl = __fmul_rn(f16(u16at(b)), (float)sc);
    *ml = __fmul_rn(f16(u16at(b + 2)), (float)m);
}
DQ(q4_k) {  // d, dmin, scales, qs
    float dl, ml;
    scale_min(b, g, &dl, &ml);
    const unsigned char* q = b + 16 + (g / 2) * 32 + j0;
    int shift = 4 * (g % 2);
    _Pragma("unroll") for (int i = 0; i < 8; ++i) v[i] = __fsub_rn(__fmul_rn(dl, (float)((q[i] >> shift) & 15)), ml);
}
DQ(q5_k) {  // d, dmin, scales, qh, qs
    float dl, ml;
    scale_min(b, g, &dl, &ml);
    const unsigned char* q = b + 48 + (g / 2) * 32 + j0;
    int shift = 4 * (g % 2);
    _Pragma("unroll") for (int i = 0; i < 8; ++i)
        v[i] = __fsub_rn(__fmul_rn(dl, (float)(((q[i] >> shift) & 15) | ((b[16 + j0 + i] >> g) & 1) << 4)), ml);
}
DQ(q6_k) {  // ql, qh, scales, d
    float dl = __fmul_rn(f16(u16at(b + 208)), (float)(signed char)b[192 + 2 * g + j0 / 16]);
    const unsigned char *ql = b + (g / 4) * 64 + (g % 2) * 32 + j0, *qh = b + 128 + (g / 4) * 32 + j0;
    int lo = 4 * ((g % 4) / 2), hi = 2 * (g % 4);
    _Pragma("unroll") for (int i = 0; i < 8; ++i)
        v[i] = __fmul_rn(dl, (float)((((ql[i] >> lo) & 15) | ((qh[i] >> hi) & 3) << 4) - 32));
}
"""
# each quantized type as X(kind, values a block, bytes a block), for the kernels made per type
DQ_TYPES = "#define DQ_TYPES(X) " + " ".join(f"X({kind}, {BLOCK_SIZES[t][0]}, {BLOCK_SIZES[t][1]})"
                                             for t, kind in QUANT.items())

SOURCE = r"""
#define WARPS 8
#define NEG_INF __int_as_float(0xff800000u)
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
// a block's sum (or max) of v, handed to every thread; blockDim.x a multiple of 32
__device__ float block_reduce(float v, float* sh, bool is_max) {
    int w = threadIdx.x / 32, l = threadIdx.x % 32, nw = blockDim.x / 32;
    v = is_max ? warp_max(v) : warp_sum(v);
    if (l == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = l < nw ? sh[l] : (is_max ? NEG_INF : 0.0f);
        v = is_max ? warp_max(v) : warp_sum(v);
        if (l == 0) sh[0] = v;
    }
    __syncthreads();
    v = sh[0];
    __syncthreads();
    return v;
}
__device__ __forceinline__ float f16(unsigned int h) {
    float f;
    unsigned short s = (unsigned short)h;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(s));
    return f;
}
__device__ __forceinline__ float bf16(unsigned int b) { return __uint_as_float((b & 0xffffu) << 16); }

// out[r] = res[r] + W[r] . x + bias[r] (res, bias: null for none); one warp a row
#define GEMV_HEAD(NAME, T)                                                                                  \
extern "C" __global__ void NAME(const T* __restrict__ W, const float* __restrict__ x, const float* bias,    \
                                const float* res, float* out, int N, int K) {                               \
    int r = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;                                 \
    if (r >= N) return;                                                                                     \
    const T* w = W + (long long)r * K;                                                                         \
    float acc = 0.0f;
#define GEMV_TAIL                                                                                           \
    acc = warp_sum(acc);                                                                                    \
    if (lane == 0) {                                                                                        \
        if (bias) acc += bias[r];                                                                           \
        if (res) acc += res[r];                                                                             \
        out[r] = acc;                                                                                       \
    }                                                                                                       \
}

GEMV_HEAD(gemv_f32, float)
    if ((K & 3) == 0) {
        const float4* w4 = (const float4*)w;
        const float4* x4 = (const float4*)x;
        #pragma unroll 4
        for (int k = lane; k < K / 4; k += 32) {
            float4 a = w4[k], b = x4[k];
            acc += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
        }
    } else {
        for (int k = lane; k < K; k += 32) acc += w[k] * x[k];
    }
GEMV_TAIL

#define GEMV_HALF(NAME, CVT)                                                                                \
GEMV_HEAD(NAME, unsigned short)                                                                             \
    if ((K & 7) == 0) {                                                                                     \
        const uint4* w8 = (const uint4*)w;                                                                  \
        const float4* x4 = (const float4*)x;                                                                \
        _Pragma("unroll 4")                                                                                 \
        for (int k = lane; k < K / 8; k += 32) {                                                            \
            uint4 a = w8[k];                                                                                \
            float4 b = x4[2 * k], c = x4[2 * k + 1];                                                        \
            acc += CVT(a.x) * b.x + CVT(a.x >> 16) * b.y + CVT(a.y) * b.z + CVT(a.y >> 16) * b.w            \
                 + CVT(a.z) * c.x + CVT(a.z >> 16) * c.y + CVT(a.w) * c.z + CVT(a.w >> 16) * c.w;           \
        }                                                                                                   \
    } else {                                                                                                \
        for (int k = lane; k < K; k += 32) acc += CVT(w[k]) * x[k];                                         \
    }                                                                                                       \
GEMV_TAIL
GEMV_HALF(gemv_f16, f16)
GEMV_HALF(gemv_bf16, bf16)

// 16-bit values to float32 (exact): n of them
extern "C" __global__ void widen_f16(const unsigned short* src, float* dst, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = f16(src[i]);
}
extern "C" __global__ void widen_bf16(const unsigned short* src, float* dst, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = bf16(src[i]);
}

// a block's sum of v in float64, handed to every thread
__device__ double block_sum_f64(double v, double* sh) {
    int w = threadIdx.x / 32, l = threadIdx.x % 32, nw = blockDim.x / 32;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (l == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = l < nw ? sh[l] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (l == 0) sh[0] = v;
    }
    __syncthreads();
    v = sh[0];
    __syncthreads();
    return v;
}

// one row of x [rows, D] a block: x * 1/sqrt(mean(x^2) + eps) * w, the float32 squares summed in float64 as
// refllama.layers.rms_norm (and ggml) sums them; res + that where res is given (a post-norm's residual)
extern "C" __global__ void rms_norm(const float* x, const float* w, const float* res, float* out, int D, float eps) {
    __shared__ double sh[32];
    const float* xr = x + (long long)blockIdx.x * D;
    double s = 0.0;
    for (int d = threadIdx.x; d < D; d += blockDim.x) s += (double)(xr[d] * xr[d]);
    float scale = 1.0f / sqrtf((float)(block_sum_f64(s, sh) / D) + eps);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        long long i = (long long)blockIdx.x * D + d;
        float y = xr[d] * scale * w[d];
        out[i] = res ? res[i] + y : y;
    }
}

// a block per head of qkv [QKV]: q and k normed per head where qn/kn are given (Qwen3), rotated by position *pos in
// the pair layout (half: (i, i + R/2); else (2i, 2i + 1)), q to q_out [H*HD], k and v to the caches [KVH, n_ctx, HD]
extern "C" __global__ void rope_store(const float* qkv, const float* cos_t, const float* sin_t, const int* pos_p,
                                      float* q_out, float* k_cache, float* v_cache, const float* qn, const float* kn,
                                      float eps, int H, int KVH, int HD, int R, int n_ctx, int half) {
    __shared__ float v[1024];
    __shared__ float sh[32];
    int b = blockIdx.x, d = threadIdx.x, pos = *pos_p;
    bool in = d < HD;
    float val = in ? qkv[(long long)b * HD + d] : 0.0f;
    if (b >= H + KVH) {
        if (in) v_cache[((long long)(b - H - KVH) * n_ctx + pos) * HD + d] = val;
        return;
    }
    const float* nw = b < H ? qn : kn;
    if (nw) {
        float scale = 1.0f / sqrtf(block_reduce(val * val, sh, false) / HD + eps);
        val = in ? val * scale * nw[d] : 0.0f;
    }
    v[d] = val;
    __syncthreads();
    float o = val;
    if (d < R) {
        int h2 = R / 2;
        bool first = half ? d < h2 : (d % 2) == 0;
        int i = half ? (first ? d : d - h2) : d / 2;
        int partner = half ? (first ? d + h2 : d - h2) : (first ? d + 1 : d - 1);
        float c = cos_t[(long long)pos * h2 + i], s = sin_t[(long long)pos * h2 + i];
        float x0 = first ? val : v[partner], x1 = first ? v[partner] : val;
        o = first ? x0 * c - x1 * s : x0 * s + x1 * c;
    }
    if (!in) return;
    if (b < H) q_out[(long long)b * HD + d] = o;
    else k_cache[((long long)(b - H) * n_ctx + pos) * HD + d] = o;
}

// a block per query head: softmax(scale * q.k) over keys lo..pos (lo: the sliding window's first), times v
extern "C" __global__ void attention(const float* q, const float* k_cache, const float* v_cache, const int* pos_p,
                                     float* scores, float* out, float scale, int H, int KVH, int HD, int n_ctx,
                                     int window) {
    __shared__ float sh[32];
    int h = blockIdx.x, g = h / (H / KVH), pos = *pos_p;
    int lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
    const float* qh = q + (long long)h * HD;
    const float* K = k_cache + (long long)g * n_ctx * HD;
    const float* V = v_cache + (long long)g * n_ctx * HD;
    float* sc = scores + (long long)h * n_ctx;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    for (int s = lo + warp; s <= pos; s += nw) {
        const float* ks = K + (long long)s * HD;
        float a = 0.0f;
        for (int d = lane; d < HD; d += 32) a += qh[d] * ks[d];
        a = warp_sum(a);
        if (lane == 0) sc[s] = a * scale;
    }
    __syncthreads();
    float m = NEG_INF;
    for (int s = lo + threadIdx.x; s <= pos; s += blockDim.x) m = fmaxf(m, sc[s]);
    m = block_reduce(m, sh, true);
    float total = 0.0f;
    for (int s = lo + threadIdx.x; s <= pos; s += blockDim.x) {
        float e = expf(sc[s] - m);
        sc[s] = e;
        total += e;
    }
    total = block_reduce(total, sh, false);
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float a = 0.0f;
        for (int s = lo; s <= pos; ++s) a += sc[s] * V[(long long)s * HD + d];
        out[(long long)h * HD + d] = a / total;
    }
}

// x [T, n, HD] rotated by position in the pair layout (half: (i, i + R/2); else (2i, 2i + 1)), cos/sin [T, R/2]:
// a block per (token, head), a thread per dim
extern "C" __global__ void rope(const float* x, const float* cos_t, const float* sin_t, float* out, int n, int HD,
                                int R, int half) {
    long long row = blockIdx.x;
    int t = blockIdx.x / n, d = threadIdx.x, h2 = R / 2;
    if (d >= HD) return;
    const float* xr = x + row * HD;
    float o = xr[d];
    if (d < R) {
        bool first = half ? d < h2 : (d % 2) == 0;
        int i = half ? (first ? d : d - h2) : d / 2;
        int partner = half ? (first ? d + h2 : d - h2) : (first ? d + 1 : d - 1);
        float c = cos_t[(long long)t * h2 + i], s = sin_t[(long long)t * h2 + i];
        float x0 = first ? xr[d] : xr[partner], x1 = first ? xr[partner] : xr[d];
        o = first ? x0 * c - x1 * s : x0 * s + x1 * c;
    }
    out[row * HD + d] = o;
}

// SiLU(g) * u, n values
extern "C" __global__ void swiglu(const float* g, const float* u, float* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = g[i] * (0.5f + 0.5f * tanhf(0.5f * g[i])) * u[i];
}

// GELU(g) (its tanh approximation) * u, n values
extern "C" __global__ void geglu(const float* g, const float* u, float* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = g[i];
    out[i] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))) * u[i];
}

// cap * tanh(x / cap), n values in place (Gemma's soft-capped logits)
extern "C" __global__ void softcap(float* x, float cap, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

// x *= s, n values (Gemma's embeddings, times sqrt(D))
extern "C" __global__ void scale(float* x, float s, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * s;
}

// a row of x [rows, n] a block: softmax(scale * x + mask), mask [T, n] (row r takes mask row r % T; null: none)
extern "C" __global__ void softmax_rows(const float* x, const float* mask, float* out, int n, int T, float scale) {
    __shared__ float sh[32];
    long long r = blockIdx.x;
    const float* xr = x + r * n;
    const float* mr = mask ? mask + (r % T) * (long long)n : 0;
    float* o = out + r * n;
    float m = NEG_INF;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, xr[j] * scale + (mr ? mr[j] : 0.0f));
    m = block_reduce(m, sh, true);
    float total = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        float e = expf(xr[j] * scale + (mr ? mr[j] : 0.0f) - m);
        o[j] = e;
        total += e;
    }
    total = block_reduce(total, sh, false);
    for (int j = threadIdx.x; j < n; j += blockDim.x) o[j] = o[j] / total;
}

// the embedding row of token *tok, to float32
extern "C" __global__ void embed_f32(const int* tok, const float* W, float* out, int D) {
    int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d < D) out[d] = W[(long long)*tok * D + d];
}
extern "C" __global__ void embed_f16(const int* tok, const unsigned short* W, float* out, int D) {
    int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d < D) out[d] = f16(W[(long long)*tok * D + d]);
}
extern "C" __global__ void embed_bf16(const int* tok, const unsigned short* W, float* out, int D) {
    int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d < D) out[d] = bf16(W[(long long)*tok * D + d]);
}
""" + DEQUANT + DQ_TYPES + r"""
// gemv's form for quantized rows of K values: eight lanes a group of 32 values, a lane 8 of them (dq_<type>)
#define GEMV_Q(T, QK, BYTES)                                                                                \
extern "C" __global__ void gemv_##T(const unsigned char* __restrict__ W, const float* __restrict__ x,        \
                                    const float* bias, const float* res, float* out, int N, int K) {         \
    int r = blockIdx.x * WARPS + threadIdx.x / 32, lane = threadIdx.x % 32, j0 = 8 * (lane % 4);            \
    if (r >= N) return;                                                                                     \
    const unsigned char* w = W + (long long)r * (K / QK) * BYTES;                                           \
    float acc = 0.0f, v[8];                                                                                 \
    for (int g = lane / 4; g < K / 32; g += 8) {                                                            \
        dq_##T(w + g / (QK / 32) * BYTES, g % (QK / 32), j0, v);                                            \
        float4 a = *(const float4*)(x + g * 32 + j0), c = *(const float4*)(x + g * 32 + j0 + 4);            \
        acc += v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w + v[4] * c.x + v[5] * c.y + v[6] * c.z      \
             + v[7] * c.w;                                                                                  \
    }                                                                                                       \
GEMV_TAIL
DQ_TYPES(GEMV_Q)

// n runs of 8 values of quantized rows of K values to float32, from row *tok where tok is given (an embedding)
#define WIDEN_Q(T, QK, BYTES)                                                                               \
extern "C" __global__ void widen_##T(const unsigned char* W, const int* tok, float* out, long long n, int K) {\
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;                                         \
    if (t >= n) return;                                                                                     \
    long long r = t / (K / 8) + (tok ? *tok : 0);                                                           \
    int g = t % (K / 8) / 4;                                                                                \
    float v[8];                                                                                             \
    dq_##T(W + r * (K / QK) * BYTES + g / (QK / 32) * BYTES, g % (QK / 32), 8 * (t % 4), v);                \
    float4* o = (float4*)(out + t * 8);                                                                     \
    o[0] = make_float4(v[0], v[1], v[2], v[3]);                                                             \
    o[1] = make_float4(v[4], v[5], v[6], v[7]);                                                             \
}
DQ_TYPES(WIDEN_Q)
"""

NULL = np.uint64(0)  # a null pointer argument


def widen_numpy(raw, kind, out=None):  # [..., stored] -> [..., K] float32
    """A matrix's (or a row's) stored values as float32, as the loaders convert a file's: 16-bit bits exactly, the
    quantized types' blocks by gguf-py's dequantize."""
    qtype = KIND[kind]
    block, size = BLOCK_SIZES[qtype]
    return QuantizedTensor(raw, qtype, (*raw.shape[:-1], raw.shape[-1] * raw.itemsize // size * block)).to_float32(out)


def stored(w):  # a weight -> (its array, its kind: "f32", or a key of KIND)
    return (w.raw, w.kind) if isinstance(w, GpuMatrix) else (w, "f32")


class NumpyKernels:
    """The mirrors: each kernel's arithmetic on NumPy arrays, writing its output buffer in place."""

    xp = np

    def gemv(self, w, x, out, bias=None, res=None):  # [N, K] . [K] (+ bias, + res) -> out [N]
        a, kind = stored(w)
        y = (widen_numpy(a, kind) if kind != "f32" else a) @ x
        if bias is not None:
            y = y + bias
        out[...] = y if res is None else res + y

    def widen(self, raw, kind, out):
        widen_numpy(raw, kind, out)

    def rms_norm(self, x, w, eps, out, res=None):  # [rows, D] (+ res) -> out
        y = layers.rms_norm(x, w, eps)
        out[...] = y if res is None else res + y

    def rope_store(self, qkv, cos, sin, pos, q_out, k_cache, v_cache, qn, kn, eps, heads, layout):
        H, KVH, HD = heads
        p = int(pos[0])
        q, k, v = np.split(qkv.reshape(H + 2 * KVH, HD), (H, H + KVH))  # [H, HD], [KVH, HD], [KVH, HD]
        if qn is not None:
            q, k = layers.rms_norm(q, qn, eps), layers.rms_norm(k, kn, eps)
        rope = layers.ROPE[layout]
        q_out[...] = rope(q[None], cos[p:p + 1], sin[p:p + 1]).reshape(-1)
        k_cache[:, p] = rope(k[None], cos[p:p + 1], sin[p:p + 1])[0]
        v_cache[:, p] = v

    def attention(self, q, k_cache, v_cache, pos, scores, out, scale, heads, window):
        H, KVH, HD = heads
        p = int(pos[0])
        lo = max(0, p - window + 1) if window else 0
        kq = layers.attention_scores(q.reshape(1, H, HD), k_cache[:, lo:p + 1])  # [H, 1, S]
        probs = layers.softmax(kq * np.float32(scale))
        scores[:, lo:p + 1] = probs[:, 0]
        out[...] = layers.attention_mix(probs, v_cache[:, lo:p + 1]).reshape(-1)

    def swiglu(self, g, u, out):  # [n], [n] -> out [n]
        out[...] = layers.swiglu(g, u)

    def geglu(self, g, u, out):  # [n], [n] -> out [n]
        out[...] = layers.geglu(g, u)

    def scale(self, x, s):  # x [n] *= s, in place
        x *= np.float32(s)

    def softcap(self, x, cap):  # x [n] -> cap tanh(x / cap), in place
        x[...] = layers.softcap(x, cap)

    def softmax_rows(self, x, mask, scale, out):  # [H, T, S], [T, S] -> out [H, T, S]
        out[...] = layers.attention_weights(x, mask, scale)

    def rope(self, x, cos, sin, layout, out):  # [T, n, HD], [T, R/2] -> out [T, n, HD]
        out[...] = layers.ROPE[layout](x, cos, sin)

    def embed(self, token, w, out):  # the row of token[0] -> out [D]
        a, kind = stored(w)
        row = a[int(token[0])]
        out[...] = widen_numpy(row, kind) if kind != "f32" else row


class CudaKernels:
    """The kernels, compiled once a process by CuPy (NVRTC) from SOURCE, launched on the current stream."""

    def __init__(self):
        import cupy

        self.xp = cupy
        self.module = cupy.RawModule(code=SOURCE, options=("--std=c++17",))
        self.fn = {}

    def _f(self, name):
        if name not in self.fn:
            self.fn[name] = self.module.get_function(name)
        return self.fn[name]

    def gemv(self, w, x, out, bias=None, res=None):
        a, kind = stored(w)
        N, K = w.shape
        self._f(f"gemv_{kind}")(((N + WARPS - 1) // WARPS,), (32 * WARPS,),
                                (a, x, NULL if bias is None else bias, NULL if res is None else res, out,
                                 np.int32(N), np.int32(K)))

    def widen(self, raw, kind, out, token=None):  # token: widen that row of raw only (an embedding)
        if kind in QUANT.values():
            n = out.size // 8  # runs of 8 values
            self._f(f"widen_{kind}")(((n + 255) // 256,), (256,), (raw, NULL if token is None else token, out,
                                                                    np.int64(n), np.int32(out.shape[-1])))
        else:
            n = raw.size
            self._f(f"widen_{kind}")(((n + 255) // 256,), (256,), (raw, out, np.int64(n)))

    def rms_norm(self, x, w, eps, out, res=None):
        D = x.shape[-1]
        self._f("rms_norm")((x.size // D,), (min(1024, 32 * ((D + 31) // 32)),), (
            x, w, NULL if res is None else res, out, np.int32(D), np.float32(eps)))

    def rope_store(self, qkv, cos, sin, pos, q_out, k_cache, v_cache, qn, kn, eps, heads, layout):
        H, KVH, HD = heads
        self._f("rope_store")((H + 2 * KVH,), (32 * ((HD + 31) // 32),), (
            qkv, cos, sin, pos, q_out, k_cache, v_cache, NULL if qn is None else qn, NULL if kn is None else kn,
            np.float32(eps), np.int32(H), np.int32(KVH), np.int32(HD), np.int32(2 * cos.shape[1]),
            np.int32(k_cache.shape[1]), np.int32(layout == "half")))

    def attention(self, q, k_cache, v_cache, pos, scores, out, scale, heads, window):
        H, KVH, HD = heads
        self._f("attention")((H,), (256,), (q, k_cache, v_cache, pos, scores, out, np.float32(scale), np.int32(H),
                                            np.int32(KVH), np.int32(HD), np.int32(k_cache.shape[1]),
                                            np.int32(window or 0)))

    def swiglu(self, g, u, out):
        n = out.size
        self._f("swiglu")(((n + 255) // 256,), (256,), (g, u, out, np.int64(n)))

    def geglu(self, g, u, out):
        n = out.size
        self._f("geglu")(((n + 255) // 256,), (256,), (g, u, out, np.int64(n)))

    def scale(self, x, s):
        n = x.size
        self._f("scale")(((n + 255) // 256,), (256,), (x, np.float32(s), np.int64(n)))

    def softcap(self, x, cap):
        n = x.size
        self._f("softcap")(((n + 255) // 256,), (256,), (x, np.float32(cap), np.int64(n)))

    def rope(self, x, cos, sin, layout, out):
        T, n, HD = x.shape
        self._f("rope")((T * n,), (32 * ((HD + 31) // 32),), (x, cos, sin, out, np.int32(n), np.int32(HD),
                                                               np.int32(2 * cos.shape[1]), np.int32(layout == "half")))

    def softmax_rows(self, x, mask, scale, out):
        n, T = x.shape[-1], mask.shape[0]
        self._f("softmax_rows")((x.size // n,), (min(1024, 32 * ((n + 31) // 32)),), (
            x, mask, out, np.int32(n), np.int32(T), np.float32(scale)))

    def embed(self, token, w, out):
        a, kind = stored(w)
        if kind in QUANT.values():
            return self.widen(a, kind, out, token)
        D = a.shape[1]
        self._f(f"embed_{kind}")(((D + 255) // 256,), (256,), (token, a, out, np.int32(D)))


_CUDA = []


def kernels(xp):
    """The kernel set of an array module: the mirrors for NumPy, the CUDA kernels (compiled once) for CuPy."""
    if xp is np:
        return NumpyKernels()
    if not _CUDA:
        _CUDA.append(CudaKernels())
    return _CUDA[0]


def contiguous(x):
    return array_module(x).ascontiguousarray(x, dtype=np.float32)


def rms_norm(x, w, eps):  # [..., D], [D] -> [..., D]: layers.rms_norm as one kernel
    x = contiguous(x)
    out = array_module(x).empty_like(x)
    kernels(array_module(x)).rms_norm(x, contiguous(w), eps, out)
    return out


def gated(unit):
    def product(gate, up):  # [T, F], [T, F] -> [T, F]: layers.swiglu or layers.geglu as one kernel
        gate = contiguous(gate)
        out = array_module(gate).empty_like(gate)
        getattr(kernels(array_module(gate)), unit)(gate, contiguous(up), out)
        return out

    return product


def attention_weights(kq, mask, scale):  # [H, T, S], [T, S] -> [H, T, S]: layers.attention_weights as one kernel
    kq = contiguous(kq)
    out = array_module(kq).empty_like(kq)
    kernels(array_module(kq)).softmax_rows(kq, contiguous(mask), scale, out)
    return out


def rope_in(layout):
    def rope(x, cos, sin):  # [T, n, HD], [T, R/2], [T, R/2] -> [T, n, HD]: layers.ROPE[layout] as one kernel
        x = contiguous(x)
        out = array_module(x).empty_like(x)
        kernels(array_module(x)).rope(x, contiguous(cos), contiguous(sin), layout, out)
        return out

    return rope


# the cupy backend's steps in float32: a prefill's norms, RoPE, softmax and gated unit one kernel each, where CuPy's
# array operations take several
OPS = layers.FLOAT32._replace(rms_norm=rms_norm, rope={layout: rope_in(layout) for layout in layers.ROPE},
                              swiglu=gated("swiglu"), geglu=gated("geglu"), attention_weights=attention_weights)


class GpuMatrix(WeightMatrix):
    """A [N, K] weight kept on the device as stored: float16/bfloat16 bits (`raw` [N, K] uint16) or GGUF's quantized
    blocks (`raw` [N, row bytes] uint8), a fraction of a float32 copy's memory and reads. One token's product (decode)
    reads them in the gemv kernel, each value unpacked exactly to its float32 value and accumulated in float32; a
    product of several tokens widens blocks of rows into the scratch and multiplies them there (cuBLAS): the values
    multiplied are those of a float32 copy either way."""

    def __init__(self, raw, kind, scratch):
        self.raw, self.kind, self.scratch = raw, kind, scratch
        block, size = BLOCK_SIZES[KIND[kind]]
        self.shape = (raw.shape[0], raw.shape[1] * raw.itemsize // size * block)
        self.xp = scratch.xp
        self.k = kernels(self.xp)

    @property
    def array_module(self):
        return self.xp

    @property
    def nbytes(self):
        return self.raw.nbytes

    def rows(self, a, b):  # rows a:b, still as stored (a view)
        return GpuMatrix(self.raw[a:b], self.kind, self.scratch)

    def float32(self, a, b, out=None):  # rows a:b -> [b - a, K] float32
        out = self.scratch.take((b - a, self.shape[1])) if out is None else out
        self.k.widen(self.raw[a:b], self.kind, out)
        return out

    def matmul(self, x):  # [T, K] -> [T, N]
        xp, (N, K) = self.xp, self.shape
        x = xp.ascontiguousarray(x, dtype=xp.float32)
        if len(x) == 1:
            out = xp.empty((1, N), xp.float32)
            self.k.gemv(self, x[0], out[0])
            return out
        block = max(1, min(N, SCRATCH_VALUES // K))
        out = xp.empty((len(x), N), xp.float32)
        for a in range(0, N, block):
            b = min(a + block, N)
            out[:, a:b] = x @ self.float32(a, b).T
        return out

    def __getitem__(self, rows):  # embedding rows: [T] -> [T, K] float32
        raw = self.raw[self.xp.asarray(self.row_ids(to_numpy(rows)))]
        out = self.xp.empty((len(raw), self.shape[1]), self.xp.float32)
        self.k.widen(raw, self.kind, out)
        return out


class GpuPlacement(Placement):
    """Weights for the cupy backend: float32 arrays on the device, but for float16/bfloat16 and quantized matrices,
    which stay as stored (GpuMatrix) unless `in_file` is False: then they are widened to float32 on the device, where
    it is fast, not on the CPU. The products are the same either way."""

    def __init__(self, xp, in_file=None):
        super().__init__(xp)
        self.keep = frozenset(STORED)
        self.in_file = in_file is not False
        self.scratch = Scratch(xp)

    def __call__(self, a):
        if not isinstance(a, QuantizedTensor):
            return self.xp.asarray(a)
        raw = np.ascontiguousarray(a.raw)
        m = GpuMatrix(self.xp.asarray(raw.view(np.uint16) if a.qtype in HALF else raw).reshape(len(raw), -1),
                      STORED[a.qtype], self.scratch)
        return m if self.in_file else m.float32(0, m.shape[0], self.xp.empty(m.shape, self.xp.float32))
