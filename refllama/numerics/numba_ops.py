"""Numerics "float32" on `--backend numba`: a decode step's small steps as Numba kernels; and the pieces of them
that refllama.numerics.ggml_kernels shares (ggml's RMSNorm, RoPE and expf, the IR dot of the attention scores).

One token's RMSNorm is six NumPy calls, its softmax five, each attention product a batched BLAS call: a decode step
is ~150 calls whose overhead is most of their time. Here each is one kernel call, in refllama.layers' float32
arithmetic: RMSNorm to the bit, RoPE ggml's (one fused multiply-add a value: to the bit NumPy's complex64 product
where NumPy fuses too), the attention sums in 16- or 64-lane vectors, the softmax's exp ggml's. A batch (prefill)
keeps refllama.layers' NumPy and BLAS, which are faster there; so do SwiGLU and GELU (NumPy's tanh is vectorized).
"""

from functools import partial

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .. import layers
from . import matrices
from .ggml_tables import (
    EXPF_C1,
    EXPF_C2,
    EXPF_C3,
    EXPF_C4,
    EXPF_C5,
    EXPF_LN2_HI,
    EXPF_LN2_LO,
    EXPF_LOG2E,
    EXPF_R,
)
from .ir import F32, I32, I64, counted_loop, hsum, lanes, load, splat

# ggml's arithmetic where refllama's float32 is the same (refllama.numerics.ggml_kernels takes these from here)


@intrinsic
def fma32(typingctx, a, b, c):
    """a * b + c rounded once (llvm.fma.f32): Numba does not fuse, and ggml's sums depend on where it does."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        fn = builder.module.declare_intrinsic("llvm.fma.f32", fnty=ir.FunctionType(F32, [F32] * 3))
        return builder.call(fn, args)

    return sig, codegen


@intrinsic
def pow2(typingctx, n):
    """2.0 ** n as a float64 made from its bits, for an integer n in float64's normal range (a power is a libm call
    per value)."""
    def codegen(context, builder, signature, args):
        bits = builder.shl(builder.add(args[0], ir.Constant(I64, 1023)), ir.Constant(I64, 52))
        return builder.bitcast(bits, ir.DoubleType())

    return types.float64(types.int64), codegen


R, LOG2E, LN2_LO, LN2_HI, C5, C4, C3, C2, C1 = (EXPF_R, EXPF_LOG2E, EXPF_LN2_LO, EXPF_LN2_HI, EXPF_C5, EXPF_C4, EXPF_C3,
                                                 EXPF_C2, EXPF_C1)


@njit(cache=True)
def expf(x):  # float32 -> float32: ggml_v_expf's AVX-512 form, one lane (refllama.numerics.ggml_float.expf)
    z = fma32(x, LOG2E, R)
    n = z - R
    b = fma32(-n, LN2_LO, fma32(-n, LN2_HI, x))
    if abs(n) > np.float32(192.0):  # beyond the range where 2^n scales: 0 or infinity
        return np.float32(0.0) if n <= np.float32(0.0) else np.float32(np.inf)
    u = b * b
    j = fma32(fma32(fma32(C5, b, C4), u, fma32(C3, b, C2)), u, fma32(C1, b, np.float32(1.0)))
    return np.float32(np.float64(j) * pow2(np.int64(n)))  # _mm512_scalef_ps: exact in float64, rounded once


@intrinsic
def bits(typingctx, x):  # float32 -> its bits, as an int64 (0 to 2^32 - 1)
    def codegen(context, builder, signature, args):
        return builder.zext(builder.bitcast(args[0], I32), I64)

    return types.int64(types.float32), codegen


@intrinsic
def from_bits(typingctx, n):  # int64 -> the float32 whose bits are its low 32 (so 32-bit arithmetic wraps)
    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.trunc(args[0], I32), F32)

    return types.float32(types.int64), codegen


@njit(cache=True)
def expf_avx2(x):  # float32 -> float32: ggml_v_expf's AVX2 form, one lane (refllama.numerics.ggml_float.expf_avx2)
    z = fma32(x, LOG2E, R)
    n = z - R
    b = fma32(-n, LN2_LO, fma32(-n, LN2_HI, x))
    e = bits(z) << 23
    u = b * b
    j = fma32(fma32(fma32(C5, b, C4), u, fma32(C3, b, C2)), u, C1 * b)
    g = 0x82000000 if n <= np.float32(0.0) else 0
    s1 = from_bits(g + 0x7F000000)
    if abs(n) > np.float32(192.0):
        return s1 * s1
    if abs(n) > np.float32(126.0):
        s2 = from_bits(e - g)
        return fma32(s2, j, s2) * s1
    k = from_bits(e + 0x3F800000)  # 2^n: n added to 1.0's exponent
    return fma32(k, j, k)


@njit(cache=True)
def _rms_norm(x, w, eps):  # [T, D], [D] -> [T, D]: layers.rms_norm, squares added one by one as ggml adds them
    T, D = x.shape
    out = np.empty_like(x)
    for t in range(T):
        total = 0.0  # float64, ggml_float
        for i in range(D):
            total += np.float64(x[t, i] * x[t, i])
        scale = np.float32(1.0) / np.sqrt(np.float32(total / D) + eps)
        for i in range(D):
            out[t, i] = x[t, i] * scale * w[i]
    return out


def rms_norm(x, w, eps):  # [..., D], [D] -> [..., D]: rows of any leading shape (Qwen3's per-head norms: [T, H, HD])
    return _rms_norm(np.ascontiguousarray(x).reshape(-1, x.shape[-1]), w, np.float32(eps)).reshape(x.shape)


@njit(cache=True)
def _rope(x, cos, sin, interleaved):  # [T, n, HD], [T, R/2], [T, R/2] -> [T, n, HD]: ggml_float.rope
    T, n, HD = x.shape
    half = cos.shape[1]
    out = x.copy()
    for t in range(T):
        for h in range(n):
            for i in range(half):
                a, b = (2 * i, 2 * i + 1) if interleaved else (i, half + i)
                x0, x1, c, s = x[t, h, a], x[t, h, b], cos[t, i], sin[t, i]
                out[t, h, a] = fma32(x0, c, -(x1 * s))
                out[t, h, b] = fma32(x0, s, x1 * c)
    return out


def rope(x, cos, sin, interleaved):  # [T, n, HD], [T, R/2], [T, R/2] -> [T, n, HD]: ggml_float.rope
    return _rope(np.ascontiguousarray(x), cos, sin, interleaved)


ROPE = {"interleaved": partial(rope, interleaved=True), "half": partial(rope, interleaved=False)}  # as layers.ROPE


V64F32 = ir.VectorType(F32, 64)


def _kq_dot(width, parts=1, fused=False, hadd8=False):
    """An intrinsic (q, k, n) -> float: one key's score over n chunks of parts x width values, as ggml sums it: one
    vector of `width` lanes for a batch (tinyBLAS: 16 lanes with AVX-512, 8 with AVX2); `parts` 4 for one token
    (ggml_vec_dot_f16: four accumulators, then added as (0 + 2) + (1 + 3)); then the vector's sum, its halves added
    (_mm512_reduce_add_ps, an __m256's hsum) or, `hadd8`, AVX2's GGML_F32x8_REDUCE end (the halves, then two
    _mm_hadd_ps). q and k are addresses of float32 values (in numerics ggml holding float16 ones, so each product is
    exact and fma and multiply-add agree). `fused`: each chunk added with one fma (ggml_vec_dot_f32's and
    tinyBLAS's sums of float32 values)."""
    vtype = ir.VectorType(F32, width * parts)

    @intrinsic
    def kq_dot(typingctx, q, k, n):
        def codegen(context, builder, signature, args):
            q, k, n = args

            def operands(c):
                at = builder.mul(c, ir.Constant(I64, 4 * width * parts))
                return load(builder, builder.add(q, at), vtype), load(builder, builder.add(k, at), vtype)

            def product(c):
                return builder.fmul(*operands(c))

            def add_product(acc, c):
                if fused:
                    fma = builder.module.declare_intrinsic(f"llvm.fma.v{width * parts}f32", fnty=ir.FunctionType(
                        vtype, [vtype] * 3))
                    return builder.call(fma, [*operands(c), acc])
                return builder.fadd(acc, product(c))

            entry, loop, done = builder.block, builder.append_basic_block("loop"), builder.append_basic_block("done")
            first = product(ir.Constant(I64, 0))
            builder.cbranch(builder.icmp_signed(">", n, ir.Constant(I64, 1)), loop, done)
            builder.position_at_end(loop)
            c, acc = builder.phi(I64), builder.phi(vtype)
            new, c1 = add_product(acc, c), builder.add(c, ir.Constant(I64, 1))
            c.add_incoming(ir.Constant(I64, 1), entry)
            c.add_incoming(c1, loop)
            acc.add_incoming(first, entry)
            acc.add_incoming(new, loop)
            builder.cbranch(builder.icmp_signed("<", c1, n), loop, done)
            builder.position_at_end(done)
            v = builder.phi(vtype)
            v.add_incoming(first, entry)
            v.add_incoming(new, loop)
            if parts == 4:
                w = width
                v = builder.fadd(builder.fadd(lanes(builder, v, 0, w), lanes(builder, v, 2 * w, w)),
                                 builder.fadd(lanes(builder, v, w, w), lanes(builder, v, 3 * w, w)))
            if hadd8:  # t = low + high half; (t0 + t1) + (t2 + t3)
                t = builder.fadd(lanes(builder, v, 0, 4), lanes(builder, v, 4, 4))
                pair = builder.fadd(builder.shuffle_vector(t, t, ir.Constant(ir.VectorType(I32, 2), [0, 2])),  # t0 + t1
                                    builder.shuffle_vector(t, t, ir.Constant(ir.VectorType(I32, 2), [1, 3])))
                return builder.fadd(builder.extract_element(pair, ir.Constant(I32, 0)),
                                    builder.extract_element(pair, ir.Constant(I32, 1)))
            return hsum(builder, v)

        return types.float32(types.int64, types.int64, types.int64), codegen

    return kq_dot


kq_dot16 = _kq_dot(16)  # refllama.numerics.ggml_kernels makes the others


@intrinsic
def weighted_sum(typingctx, y, v, stride, p, S, n):
    """(y, v, stride, p, S, n): y[j] = sum over s < S (S >= 1) of p[s] * v_s[j], for n chunks of 64 float32 values;
    y, p and v (row s at v + s * stride bytes) are addresses. Each chunk's 64 sums stay in registers over the S rows (a
    store and a load of y per row were most of the time)."""
    def codegen(context, builder, signature, args):
        y, v, stride, p, S, n = args
        fma = builder.module.declare_intrinsic("llvm.fma.v64f32", fnty=ir.FunctionType(V64F32, [V64F32] * 3))

        def chunk(c, _):
            def row(r, acc):
                at = builder.add(builder.add(v, builder.mul(r, stride)), builder.mul(c, ir.Constant(I64, 256)))
                weight = load(builder, builder.add(p, builder.mul(r, ir.Constant(I64, 4))), F32)
                return [builder.call(fma, [splat(builder, weight, V64F32), load(builder, at, V64F32), acc[0]])]

            total, = counted_loop(builder, S, [ir.Constant(V64F32, None)], row)
            out = builder.inttoptr(builder.add(y, builder.mul(c, ir.Constant(I64, 256))), V64F32.as_pointer())
            builder.store(total, out, align=4)
            return []

        counted_loop(builder, n, [], chunk)
        return context.get_dummy_value()

    return types.none(*[types.int64] * 6), codegen


@njit(cache=True)
def _scores1(q, k):  # [1, H, HD], [KVH, S, HD] (HD % 16 == 0, rows contiguous) -> [H, 1, S]
    _, H, HD = q.shape
    KVH, S, _ = k.shape
    out = np.empty((H, 1, S), np.float32)
    for h in range(H):
        q0, k0 = q.ctypes.data + h * HD * 4, k.ctypes.data + (h // (H // KVH)) * k.strides[0]
        for s in range(S):
            out[h, 0, s] = kq_dot16(q0, k0 + s * k.strides[1], HD // 16)
    return out


@njit(cache=True)
def _softmax1(kq, mask, scale):  # [H, 1, S], [1, S] -> [H, 1, S]: softmax(scale * kq + mask)
    H, _, S = kq.shape
    out = np.empty_like(kq)
    for h in range(H):
        top = np.float32(-np.inf)
        for s in range(S):
            out[h, 0, s] = kq[h, 0, s] * scale + mask[0, s]
            top = max(top, out[h, 0, s])
        for s in range(S):  # apart from the sum, so that LLVM vectorizes expf
            out[h, 0, s] = expf(out[h, 0, s] - top)
        total = np.float32(0.0)
        for s in range(S):
            total += out[h, 0, s]
        for s in range(S):
            out[h, 0, s] /= total
    return out


@njit(cache=True)
def _mix1(p, v):  # [H, 1, S], [KVH, S, HD] (HD % 64 == 0, rows contiguous) -> [1, H, HD]
    H, _, S = p.shape
    KVH, _, HD = v.shape
    out = np.empty((1, H, HD), np.float32)
    for h in range(H):
        weighted_sum(out.ctypes.data + h * HD * 4, v.ctypes.data + (h // (H // KVH)) * v.strides[0], v.strides[1],
                     p.ctypes.data + h * S * 4, S, HD // 64)
    return out


def attention_scores(q, k):  # [T, H, HD], [KVH, S, HD] -> [H, T, S]
    if len(q) > 1 or q.shape[2] % 16 or k.strides[2] != 4:
        return layers.attention_scores(q, k)
    return _scores1(np.ascontiguousarray(q), k)


def attention_weights(kq, mask, scale, sinks=None):  # [H, T, S], [T, S], [H] -> [H, T, S]
    if kq.shape[1] > 1 or sinks is not None:  # a prefill, or gpt-oss's sinks: NumPy's
        return layers.attention_weights(kq, mask, scale, sinks)
    return _softmax1(np.ascontiguousarray(kq), np.ascontiguousarray(mask, dtype=np.float32), np.float32(scale))


def attention_mix(p, v):  # [H, T, S], [KVH, S, HD] -> [T, H*HD]
    if p.shape[1] > 1 or v.shape[2] % 64 or v.strides[2] != 4:
        return layers.attention_mix(p, v)
    return _mix1(np.ascontiguousarray(p), v).reshape(1, -1)


# SwiGLU and GELU stay NumPy's (its tanh is vectorized); so do the RoPE tables, computed once
OPS = layers.Ops(rms_norm=rms_norm, rope=ROPE, rope_cos_sin=layers.rope_cos_sin, attention_scores=attention_scores,
                 attention_weights=attention_weights, attention_mix=attention_mix, swiglu=layers.swiglu,
                 gelu=layers.gelu_tanh, geglu=layers.geglu, softcap=layers.softcap, kv_f16=False,
                 q_first=False, mul_mat_id=matrices.mul_mat_id)


