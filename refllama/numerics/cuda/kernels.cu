// refllama's CUDA kernels (refllama/numerics/gpu.py loads, compiles and mirrors them; its docstring says why).
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
#include "dequant.cuh"
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
