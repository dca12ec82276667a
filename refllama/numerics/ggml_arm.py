"""llama.cpp's quantized products on ARM (ggml-cpu's `arch/arm`, its repack kernels and i8mm's two-row vec_dots),
written out in NumPy on a GgmlMatrix `m`: which form a product of T tokens takes (`matmul`), and each form's float
steps over the exact integer sums of refllama.numerics.ggml_quantize. The two ARM paths (neon-dotprod, neon-i8mm)
differ in which forms they have (refllama.numerics.ggml_float.LANES: llamafile's tinyBLAS or not).
"""

import numpy as np

from ..errors import RefllamaError
from ..formats.ggml_types import GGMLType as QT
from .ggml_float import fma, reduce_pairs
from .ggml_quantize import Q8_1, Q8_K, VEC_DOT_TYPE, block_sums, quantize_q8_0, quantize_q8_1, quantize_q8_K

UNFUSED_GEMM = {"q8_0_4x4_q8_0"}  # repacked forms whose gemm adds acc + isum * scale (vmlaq_f32: GCC keeps it unfused)
# The repacked K-quant forms, (form, gemv or gemm) -> (values a float step sums, whether acc = fma(isum, d_w d_x,
# acc) (else acc + isum * (d_w d_x), the product rounded first), when the mins come off: a block's "after" its sums
# or "first", or "each" 64 values' after theirs; the mins always acc - msum * (dmin_w d_x), unfused (vmlsq_f32).
# Read in arch/arm/repack.cpp and in the builds' code (which vmulq/vaddq pairs GCC fuses).
K_FORMS = {("q4_K_8x4_q8_K", "gemv"): (64, True, "after"), ("q4_K_8x4_q8_K", "gemm"): (64, True, "after"),
           ("q5_K_8x4_q8_K", "gemv"): (64, True, "after"), ("q5_K_8x4_q8_K", "gemm"): (64, True, "after"),
           ("q6_K_8x4_q8_K", "gemv"): (256, True, None), ("q6_K_8x4_q8_K", "gemm"): (256, False, None),
           ("q4_K_8x8_q8_K", "gemv"): (32, True, "after"), ("q4_K_8x8_q8_K", "gemm"): (256, False, "first"),
           ("q5_K_8x8_q8_K", "gemv"): (32, True, "each"), ("q5_K_8x8_q8_K", "gemm"): (256, False, "first"),
           ("q6_K_8x8_q8_K", "gemv"): (256, False, None), ("q6_K_8x8_q8_K", "gemm"): (256, False, None)}
TWO_ROWS = (QT.Q4_0, QT.Q4_1, QT.Q8_0)  # the types whose i8mm vec_dot takes two rows (vmmlaq_s32)


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


def matmul(m, x):  # [T, K] f32 -> [T, N] f32
    """A repacked matrix's gemm on the tokens in fours (a K-quant's four at a time) and its gemv on the rest (their
    activations alike); on neon-i8mm, which has no tinyBLAS, Q4_0/Q4_1/Q8_0's vec_dots two rows and two tokens at a
    time where ggml's work chunk allows (mmla_pairs); else tinyBLAS_Q0_ARM for a batch of Q4_0 or Q8_0, one vec_dot
    per row and token for the rest."""
    N, K = m.shape
    T, xp = len(x), m.xp
    four = T - T % 4
    if m.repacked and VEC_DOT_TYPE[m.qtype] == Q8_K:
        parts = [(x[t:t + 4], "gemm") for t in range(0, four, 4)] + [(x[t:t + 1], "gemv") for t in range(four, T)]
        return xp.concatenate([product(m, p, form) for p, form in parts])
    if m.repacked:
        return xp.concatenate([product(m, x[:four], "gemm"), product(m, x[four:], "gemv")])
    if not m.llamafile and T > 1 and (m.qtype in TWO_ROWS or m.qtype in (QT.Q4_K, QT.Q6_K)):
        pairs = mmla_pairs(N, T)  # i8mm: ggml's vec_dots, two rows at a time where the work chunk allows
        if pairs.any() and m.qtype not in TWO_ROWS:
            raise RefllamaError(f"a {m.qtype.name} matrix not repacked, {T} tokens on the neon-i8mm path: its "
                                "two-row vec_dot (vmmlaq_s32) is not reproduced; run an odd number of tokens")
        if pairs.any():
            step, parts = m.pass_rows(), []
            for t in range(0, T, step):
                xs, ps = x[t:t + step], pairs[t:t + step]
                two = product(m, xs, "mmla")
                parts.append(two if ps.all() else xp.where(xp.asarray(ps), two, product(m, xs, "vec_dot")))
            return xp.concatenate(parts)
    tiny = m.llamafile and m.qtype in (QT.Q4_0, QT.Q8_0)  # tinyBLAS_Q0_ARM: no Q5_0, no Q8_1 types
    form = "tinyblas" if T > 1 and tiny else "vec_dot"
    return m.in_passes(x, lambda xs: product(m, xs, form))


def matmul_id(m, x):  # [T, K] f32 -> [T, N] f32: llama.cpp's mul_mat_id for one expert's rows
    """A repacked K-quant's rows one at a time through the gemv (repack.cpp's forward_mul_mat_id); any other matrix
    one vec_dot per row and token."""
    if m.repacked and VEC_DOT_TYPE[m.qtype] == Q8_K:
        return m.xp.concatenate([product(m, x[t:t + 1], "gemv") for t in range(len(x))])
    return product(m, x, "vec_dot")


def product(m, x, form):  # [T, K] f32, one form -> [T, N] f32
    x = m.xp.ascontiguousarray(x, dtype=np.float32)
    vdt = VEC_DOT_TYPE[m.qtype]
    if vdt == Q8_K:
        xq, dx, bsums = quantize_q8_K(x, fused=True)
        return k_repacked(m, xq, dx, bsums, form) if m.repacked else k_vec_dot(m, xq, dx, bsums)
    if vdt == Q8_1:
        xq, dx, sx = quantize_q8_1(x, inverse_d=True)
        return m.dot_blocks(xq, dx, False, sx) if form == "mmla" else dot_lanes(m, xq, dx, False, sx)
    xq, _, dx = quantize_q8_0(x, inverse_d=True)
    if m.repacked or form == "mmla":
        return m.dot_blocks(xq, dx, fused=form != "mmla" and not (form == "gemm" and m.form in UNFUSED_GEMM))
    return dot_lanes(m, xq, dx, form == "tinyblas")


def k_repacked(m, xq, dx, bsums, path):  # Q8_K x [T, K] -> [T, N]: ARM's repacked K-quant forms
    """ggml_gemv/gemm_q4_K_8x4_q8_K and the others of K_FORMS: exact integer sums over a step of values
    (Q6_K's -32 taken off through x's sums), each rounded to float32 once and added fused or not; Q4_K's and
    Q5_K's mins, msum (x's sums of 32 times each sub-block's min), taken off unfused where the form does."""
    xp, w = m.xp, m.w
    T, N = len(xq), m.shape[0]
    step, fused, when = K_FORMS[m.form, path]
    sums = block_sums(xq, m.codes_t, m.group)  # [K/group, T, N]
    xsums = bsums.reshape(T, -1, 2).sum(axis=-1).astype(np.float64)  # [T, K/32]: x's sums of 32
    acc = xp.zeros((T, N), np.float32)

    def mins(B, subs):  # the mins of block B's sub-blocks of 32 `subs`, times dmin_w d_x (rounded)
        return m.msum(xsums, subs) * (w.dmin[None, :, B] * dx[:, B, None])

    per, span = 256 // m.group, step // m.group  # a block's groups, a step's
    for B in range(len(sums) // per):
        scale = w.d[None, :, B] * dx[:, B, None]
        if when == "first":
            acc = acc - mins(B, slice(8 * B, 8 * B + 8))
        for j in range(B * per, (B + 1) * per, span):
            isum = m.isum(sums, slice(j, j + span))
            acc = fma(isum, scale, acc) if fused else acc + isum * scale
            end = (j + span) * m.group // 32  # sub-blocks of 32 summed so far
            if when == "each" and end % 2 == 0:
                acc = acc - mins(B, slice(end - 2, end))
        if when == "after":
            acc = acc - mins(B, slice(8 * B, 8 * B + 8))
    return acc


def k_vec_dot(m, xq, dx, bsums):  # Q8_K x [T, K] -> [T, N]: ARM's ggml_vec_dot_q*_K_q8_K (NEON)
    """A block's code products and its mins' products are exact integers (isum, msum); the float steps, as the
    build's code has them (d = d_w d_x, dmin = dmin_w d_x): Q2_K sum = fma(-dmin, msum, sum), then fma(isum, d,
    sum); Q3_K and Q6_K fma(isum, d, sum); Q4_K sum - msum dmin fused, then fma(isum, d, sum); Q5_K
    sum + fma(isum, d, -(msum dmin))."""
    xp, w = m.xp, m.w
    T, N = len(xq), m.shape[0]
    sums = block_sums(xq, m.codes_t, m.group)  # [K/group, T, N]
    xs = bsums.reshape(T, -1, m.group // 16).sum(axis=-1).astype(np.float64)  # [T, K/group]: x's group sums
    per = 256 // m.group
    acc = xp.zeros((T, N), np.float32)
    for B in range(len(sums) // per):
        g = slice(B * per, (B + 1) * per)
        d = w.d[None, :, B] * dx[:, B, None]
        isum = m.isum(sums, g)
        if w.dmin is None:  # Q3_K, Q6_K
            acc = fma(isum, d, acc)
            continue
        msum = m.msum(xs, g)
        dmin = w.dmin[None, :, B] * dx[:, B, None]
        if m.qtype == QT.Q5_K:
            acc = acc + fma(isum, d, -(msum * dmin))
        else:  # Q2_K, Q4_K
            acc = fma(isum, d, fma(-dmin, msum, acc))
    return acc


def dot_lanes(m, xq, dx, tiny, sx=None):  # blocks of 32 x Q8_0 or Q8_1 (sx), ARM's order: [T, K] -> [T, N]
    """Lane j of a block sums its products 4j..4j+3 and 16+4j..16+4j+3 (two vdotq_s32), exactly; each lane
    acc + lane * (d_w * d_x), the product rounded first (GCC keeps vmlaq_n_f32 unfused). `tiny` (llamafile's
    tinyBLAS_Q0_ARM, a batch): one vector over every block, its lanes summed in pairs. Else
    ggml_vec_dot_q8_0_q8_0: even and odd blocks in two vectors, each summed in pairs, then added; an odd last
    block's integer sum fma'd onto that (the build's code: fmul and fadd in the loop, fmadd after it; Q4_0's
    (isum d_w) d_x, isum d_w rounded first). Q8_1's
    offsets (ggml_vec_dot_q4_1_q8_1): summs + fma(m_w s_x of the even block, round(that of the odd one)) a pair,
    added after the lanes; an odd last block adds fma(d_w d_x, isum, round(m_w s_x)) after that."""
    xp, w = m.xp, m.w
    T, N = len(xq), m.shape[0]
    groups = block_sums(xq, m.codes_t.reshape(-1, 4, N), 4).reshape(-1, 8, T, N)  # [K/32, 8, T, N]
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
    if nb % 2 and m.qtype == QT.Q4_0:  # its C: sumf += sumi * d_w * d_x
        return fma(lanes[-1].sum(axis=-1) * w.d.T[-1][None, :], dx.T[-1][:, None], total)
    return fma(lanes[-1].sum(axis=-1), scale[-1, ..., 0], total) if nb % 2 else total
