"""llama.cpp's quantized products on x86 (ggml-cpu's `arch/x86`, its repack and tiled kernels), written out in
NumPy on a GgmlMatrix `m`: which form a product of T tokens takes (`matmul`), and each form's float steps over the
exact integer sums of refllama.numerics.ggml_quantize. The AVX-512 and AVX2 paths sum these alike; they differ in
the float steps of refllama.numerics.ggml_float.
"""

import numpy as np

from ..formats.ggml_types import GGMLType as QT
from .ggml_float import fma
from .ggml_quantize import Q8_1, Q8_K, VEC_DOT_TYPE, block_sums, quantize_q8_0, quantize_q8_1, quantize_q8_K

GEMM_STEP = {QT.Q4_K: 2, QT.Q2_K: 4}  # a repacked gemm's float step, in sub-blocks of 32 (the gemv's: a block)


def matmul(m, x):  # [T, K] f32 -> [T, N] f32
    """A repacked K-quant's gemm on each four tokens and its gemv on the rest (their activations differ in ties,
    their float steps in span); a K-quant's tiled kernel for a batch of 8 or more (ggml-cpu/tiled); else one vec_dot
    per row and token (llamafile's tinyBLAS sums a batch as the vec_dot does; Q4_0's repacked gemm and gemv alike)."""
    T = len(x)
    if m.repacked and VEC_DOT_TYPE[m.qtype] == Q8_K:
        four = T - T % 4
        parts = [(x[t:t + 4], "gemm") for t in range(0, four, 4)] + [(x[t:t + 1], "gemv") for t in range(four, T)]
        return m.xp.concatenate([product(m, p, form) for p, form in parts])
    form = "tiled" if VEC_DOT_TYPE[m.qtype] == Q8_K and T >= 8 else "vec_dot"
    return m.in_passes(x, lambda xs: product(m, xs, form))


def matmul_id(m, x):  # [T, K] f32 -> [T, N] f32: llama.cpp's mul_mat_id for one expert's rows
    """A repacked K-quant's rows one at a time through the gemv (repack.cpp's forward_mul_mat_id), with their
    activations quantized row by row; any other matrix as matmul takes a batch of that many rows."""
    if m.repacked and VEC_DOT_TYPE[m.qtype] == Q8_K:
        return m.xp.concatenate([product(m, x[t:t + 1], "gemv") for t in range(len(x))])
    return matmul(m, x)


def product(m, x, form):  # [T, K] f32, one form -> [T, N] f32
    x = m.xp.ascontiguousarray(x, dtype=np.float32)
    vdt = VEC_DOT_TYPE[m.qtype]
    if vdt == Q8_K:
        xq, dx, bsums = quantize_q8_K(x, in_fours=form == "gemm")
        return k_lanes(m, xq, dx, bsums) if form == "vec_dot" else k_steps(m, xq, dx, bsums, form)
    if vdt == Q8_1:  # no repacked form: every product a vec_dot
        xq, dx, sx = quantize_q8_1(x)
        return dot_lanes(m, xq, dx, sx)
    xq, _, dx = quantize_q8_0(x)
    if m.repacked:
        return m.dot_blocks(xq, dx)
    return mxfp4_lanes(m, xq, dx) if m.qtype == QT.MXFP4 else dot_lanes(m, xq, dx, None)


def k_steps(m, xq, dx, bsums, path):  # Q8_K x [T, K] -> [T, N]
    """The K-quant kernels that sum exact integers over a step of sub-blocks, then take float steps: isum (the
    sub-blocks' scales times their code products) and msum (their mins times x's sums of 32), each rounded to
    float32 once.
      gemm, gemv (x86's repacked ggml_gemm/gemv_q4_K_8x8_q8_K, q2_K's; gemm steps of 64 values (Q2_K: 128), gemv
      steps of a block):
        acc = fma(isum, d_w * d_x, acc), accm = fma(msum, dmin_w * d_x, accm); the product acc - accm.
      tiled (ggml-cpu/tiled, its AVX-512 VNNI kernel; steps of a block):
        r = fma(-dmin_w, msum, isum * d_w), acc = fma(r, d_x, acc) (GCC contracts its multiply and add)."""
    xp, w = m.xp, m.w
    T, N = len(xq), m.shape[0]
    span = GEMM_STEP[m.qtype] if path == "gemm" else 8  # sub-blocks of 32 (or pairs of 16) per float step
    sums = block_sums(xq, m.codes_t, m.group)  # [K/group, T, N]
    per = 32 // m.group  # sub-blocks per 32
    xsums = bsums.reshape(T, -1, 2 // per).sum(axis=-1).astype(np.float64)  # [T, K/group]: x's sums of a sub-block
    acc, accm = xp.zeros((T, N), np.float32), xp.zeros((T, N), np.float32)
    for j in range(0, len(sums) // per, span):
        g, B = slice(j * per, (j + span) * per), j // 8
        isum = m.isum(sums, g)  # [T, N]
        msum = None if w.dmin is None else m.msum(xsums, g)
        if path == "tiled":
            r = isum * w.d[None, :, B]
            if msum is not None:
                r = fma(-w.dmin[None, :, B], msum, r)
            acc = fma(r, dx[:, B, None], acc)
        else:
            acc = fma(isum, w.d[None, :, B] * dx[:, B, None], acc)
            accm = fma(msum, w.dmin[None, :, B] * dx[:, B, None], accm)
    return acc - accm


def k_lanes(m, xq, dx, bsums):  # Q8_K x [T, K] -> [T, N]
    """x86's ggml_vec_dot_q4_K_q8_K (q5_K, q6_K), step by step: element e of each block of 256 adds into int32
    lane (e % 32) // 4, times its sub-block's scale (Q6_K: its codes 0..63, and each lane l takes back 32 *
    scale * x's sums of the sub-blocks 2l and 2l + 1); per block acc = fma(d_x * d_w, lane, acc) in 8 lanes.
    The mins: Q4_K fma(-d_x * dmin_w, pair sums, accm) in 4 lanes, pairs k = sub-blocks 2k and 2k + 1; Q5_K
    one fma of the whole sum; Q2_K, before the block's codes, into the same 8 lanes, lane l the sub-blocks of 16
    2l and 2l + 1 (Q3_K: none). Then the 8 lanes added as hsum_float_8, plus the mins' (0 + 2) + (1 + 3)."""
    xp, w, qtype = m.xp, m.w, m.qtype
    T, N = len(xq), m.shape[0]
    chunks = block_sums(xq, m.codes_t.reshape(-1, 4, N), 4)  # [K/4, T, N]: chunk c of block B is 64B + c
    per_scale = m.group // 4  # chunks per sub-block scale
    acc = xp.zeros((8, T, N), np.float32)
    accm = xp.zeros((4, T, N) if qtype == QT.Q4_K else (T, N), np.float32)
    for B in range(len(chunks) // 64):
        c = np.arange(64)
        sc = w.sc.T[B * 256 // m.group + c // per_scale].astype(np.float64)  # [64, N]: each chunk's scale
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


def dot_lanes(m, xq, dx, sx):  # blocks of 32 x Q8_0 or Q8_1 (sx), in ggml's x86 order: [T, K] -> [T, N]
    """ggml_vec_dot_q4_1_q8_1 (and q4_0, q5_0, q5_1, q8_0 x q8_0) on x86, step by step, so that the result is
    llama.cpp's to the bit: each block's 32 products are summed in 8 lanes of 4 (vpdpbusd); each lane
    accumulates fma(d_w * d_x, lane, acc) over the blocks, Q8_1's offsets fma(m_w, s_x, summs); the 8 lanes
    are added as ((0+4)+(2+6))+((1+5)+(3+7)), then summs."""
    xp, w = m.xp, m.w
    T, N = len(xq), m.shape[0]
    lanes = block_sums(xq, m.codes_t.reshape(-1, 4, N), 4)  # [K/4, T, N]: lane j of block b is 8b + j
    acc = xp.zeros((8, T, N), np.float32)
    summs = xp.zeros((T, N), np.float32)
    for b in range(len(lanes) // 8):
        acc = fma(w.d[None, :, b] * dx[:, b, None], lanes[8 * b:8 * b + 8], acc)  # d_w * d_x in float32
        if sx is not None:
            summs = fma(w.m[None, :, b], sx[:, b, None], summs)
    r4 = acc[4:] + acc[:4]  # hsum_float_8: high half + low half, then pairs, then the two left
    return ((r4[0] + r4[2]) + (r4[1] + r4[3])) + summs


def mxfp4_lanes(m, xq, dx):  # MXFP4 x Q8_0 [T, K] -> [T, N]: ggml_vec_dot_mxfp4_q8_0 on x86 (its AVX2 code)
    """Blocks in pairs: each block's 32 products summed in 8 lanes of 4 (exact), the even blocks' lanes accumulated
    by fma(d_x * d_w, lane, acc1), the odd blocks' into acc2; hsum_float_8(acc1 + acc2); an odd last block's exact
    sum then added as fma(d_x * d_w, sum, total) (GCC contracts the scalar loop's multiply and add)."""
    xp, w = m.xp, m.w
    T, N = len(xq), m.shape[0]
    lanes = block_sums(xq, m.codes_t.reshape(-1, 4, N), 4)  # [K/4, T, N]: lane j of block b is 8b + j
    nb = len(lanes) // 8
    acc = xp.zeros((2, 8, T, N), np.float32)
    for b in range(nb - nb % 2):
        acc[b % 2] = fma(dx[:, b, None] * w.d[None, :, b], lanes[8 * b:8 * b + 8], acc[b % 2])
    both = acc[0] + acc[1]
    r4 = both[4:] + both[:4]  # hsum_float_8: high half + low half, then pairs, then the two left
    total = (r4[0] + r4[2]) + (r4[1] + r4[3])
    if nb % 2:
        total = fma(dx[:, nb - 1, None] * w.d[None, :, nb - 1], lanes[8 * nb - 8:].sum(axis=0), total)
    return total
