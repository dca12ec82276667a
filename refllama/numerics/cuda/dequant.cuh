// GGUF's quantized blocks, 8 values at a time: dq_<type>(block, g, j0, v) writes values j0 .. j0 + 7 of the block's
// group g of 32 (j0 a multiple of 8) into v[8], as gguf-py's dequantize computes them (each product and sum rounded
// on its own: the _rn intrinsics, which are never fused into a multiply-add). Eight lanes share a group, so that a
// warp's loads of codes and of x are contiguous. Plain C but for f16, __device__, __forceinline__ and the
// intrinsics, so the host's C compiler runs it too (tests/test_gpu.py). Layouts: ggml-common.h's block_<type>.
// DQ_TYPES(X), defined by gpu.py from the block table, lists each type as X(kind, values a block, bytes a block).
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
DQ(mxfp4) {  // e (E8M0: half of 2^(e - 127), ggml_e8m0_to_fp32_half), qs (E2M1 codes, doubled: kvalues_mxfp4)
    const int kv[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    float d = __uint_as_float(b[0] < 2 ? 0x00200000u << b[0] : (unsigned int)(b[0] - 1) << 23);
    _Pragma("unroll") for (int i = 0; i < 8; ++i) v[i] = __fmul_rn(d, (float)kv[nibble(b + 1, j0 + i)]);
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
