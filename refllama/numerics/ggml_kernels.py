"""numerics "ggml" on `--backend numba`: the operations table (OPS) and the placement that makes each matrix the
kernel's form (ggml_blocks for Q4_0/Q4_1/Q5_0/Q8_0, ggml_kquants for the K-quants, ggml_numerics' NumPy form for
Q5_1), and the steps between the products as Numba kernels: SwiGLU, the attention's softmax, q.k and p.V in
float16 sums. The same arithmetic as numerics.ggml_numerics, held bit-equal to it by the tests.
"""

import math
from functools import partial

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ..formats.ggml_types import GGMLType as QT
from ..formats.ggml_types import QuantizedTensor, byte_shape
from ..layers import Ops
from . import ggml_float
from .cpu_paths import EMULATED
from .ggml_blocks import BLOCK_BYTES, NumbaGgmlMatrix, _round_f16, _round_f16s
from .ggml_float import AVX512, cos_sin, geglu, gelu, l2_norm, layer_norm, rope_cos_sin, sigmoid, softcap, softplus
from .ggml_kquants import K_QUANTS, NumbaKQuantMatrix
from .ggml_numerics import F16Matrix, F32Matrix, GgmlPlacement, id_product, repacked
from .ir import I64, counted_loop, load, specialize, splat
from .kernel_pages import compile_notice, map_experts, release_loader_pages, warm_up_steps
from .matrices import fuse_layer, mul_mat_id
from .numba_ops import ROPE, V64F32, _kq_dot, expf, expf_avx2, fma32, kq_dot16, rms_norm
from .quant import concat_blocks

# A CPU path's float steps (ggml_float.LANES) as Numba kernels. Each kernel below is written once over these
# names, and compiled once per path with that path's values (ir.specialize; PATH_KERNELS): PW float32 lanes a
# vector, EXPF its ggml_v_expf, HADD8 whether a vec_dot's last vector is summed by AVX2's two hadds (else its halves
# added), KQ_ONE / KQ_MANY the IR dots of one token's and a batch's attention scores, F32_ONE / F32_MANY of an F32
# matrix's products. The AVX-512 path's values stand here, so that the functions also read as that path's kernels.
PW, EXPF, HADD8 = 16, expf, False
KQ_ONE, KQ_MANY = _kq_dot(16, parts=4), kq_dot16
F32_ONE, F32_MANY = _kq_dot(16, parts=4, fused=True), _kq_dot(16, fused=True)


@njit(cache=True)
def _halves(a, w):  # a[:w] -> their sum, the high half added to the low one until one lane is left (w a power of 2)
    while w > 1:
        w //= 2
        for i in range(w):
            a[i] = a[i] + a[w + i]
    return a[0]


@njit(cache=True)
def _fold(lanes, w):  # [4 w, m] -> lanes[:w] = (0 + 2) + (1 + 3) of the four w-lane accumulators (ggml_vec_dot_f16)
    for lane in range(w):
        for j in range(lanes.shape[1]):
            lanes[lane, j] = (lanes[lane, j] + lanes[2 * w + lane, j]) + (lanes[w + lane, j] + lanes[3 * w + lane, j])


@njit(cache=True)
def _reduce_rows(lanes, w, hadd8):  # [>=w, m] -> lanes[0] = each column's w lanes summed: halves, or AVX2's hadds
    if hadd8:
        for j in range(lanes.shape[1]):
            t0, t1 = lanes[0, j] + lanes[4, j], lanes[1, j] + lanes[5, j]
            t2, t3 = lanes[2, j] + lanes[6, j], lanes[3, j] + lanes[7, j]
            lanes[0, j] = (t0 + t1) + (t2 + t3)
        return
    while w > 1:
        w //= 2
        for lane in range(w):
            for j in range(lanes.shape[1]):
                lanes[lane, j] += lanes[w + lane, j]


def _swiglu(gate, up):  # [T, F], [T, F] -> [T, F]: x / (1 + expf(-x)) * up, as ggml_vec_swiglu_f32
    out = np.empty_like(gate)
    T, F = gate.shape
    body = F - F % PW  # whole vectors: ggml_v_expf; the rest: the C library's expf
    for t in prange(T):
        for i in range(body):
            x = gate[t, i]
            out[t, i] = x / (np.float32(1.0) + EXPF(-x)) * up[t, i]
        for i in range(body, F):
            x = gate[t, i]
            out[t, i] = x / (np.float32(1.0) + np.float32(math.exp(-x))) * up[t, i]
    return out


def _softmax(kq, mask, scale, sinks):  # [H, T, S], [T, S], [H] or [0] -> [H, T, S]: ggml_float.attention_weights
    H, T, S = kq.shape
    out = np.empty_like(kq)
    for ht in prange(H * T):
        h, t = ht // T, ht % T
        w = np.empty(S, np.float32)
        mx = sinks[h] if len(sinks) else np.float32(-np.inf)
        for s in range(S):
            w[s] = kq[h, t, s] * scale + mask[t, s]
            mx = max(mx, w[s])
        lanes = np.zeros(PW, np.float32)
        total = 0.0  # float64, as ggml_float
        for s in range(S):
            e = EXPF(w[s] - mx)
            out[h, t, s] = e
            lanes[s % PW] = e
            if s % PW == PW - 1 or s == S - 1:  # a vector (the last padded with zeros)
                total += _halves(lanes, PW)
                lanes[:] = 0.0
        if len(sinks):  # the C library's expf, as ggml's soft_max adds a sink
            total += np.float32(math.exp(np.float32(sinks[h] - mx)))
        inv = np.float32(1.0 / total)
        for s in range(S):
            out[h, t, s] *= inv
    return out


@njit(cache=True)
def _f16_sums(a, bt, out, many, padded, pw, hadd8):  # a [n], bt [n, m] f32 (float16 values) -> out [m]: sum_i a[i] *
    """bt[i, j], added in ggml's order on a path of `pw` lanes (ggml_float.f16_dots says which): lane l holds
    elements l, l + W, l + 2W, ..., W = pw for a batch (tinyBLAS), 4 pw for one token (vec_dot_f16, whose n % 4 pw
    leftovers are added in float64 after its lanes, unless llama.cpp `padded` the row with zeros to whole lanes).
    Vectorized over the m columns."""
    n, m = bt.shape
    W = pw if many else 4 * pw
    body = n if many or padded else n - n % W
    used = body  # a's zeros at the end (the keys a causal row does not see) add nothing to any lane: skipped
    while used > 0 and a[used - 1] == 0:
        used -= 1
    lanes = np.zeros((W, m), np.float32)
    for c in range(0, used, W):
        for lane in range(min(W, used - c)):
            x = a[c + lane]
            for j in range(m):
                lanes[lane, j] += x * bt[c + lane, j]
    if not many:
        _fold(lanes, pw)
    _reduce_rows(lanes, pw, hadd8 and not many)
    for j in range(m):
        total = np.float64(lanes[0, j])
        for i in range(body, n):
            total += np.float64(a[i] * bt[i, j])
        out[j] = np.float32(total)


def _scores_ir(qh, k):  # [T, H, HD] f32, [KVH, S, HD] f32 (float16 values; HD % 4PW == 0, contiguous) -> [H, T, S]
    T, H, HD = qh.shape
    KVH, S, _ = k.shape
    out = np.empty((H, T, S), np.float32)
    G = H // KVH
    if T == 1:  # one token: each key read once for the G heads that share it (latent attention: all of them)
        n_chunks = (S + 15) // 16
        for c in prange(KVH * n_chunks):
            g, first = c // n_chunks, 16 * (c % n_chunks)
            q0, k0 = qh.ctypes.data, k.ctypes.data + g * k.strides[0]
            for s in range(first, min(first + 16, S)):
                for h in range(g * G, (g + 1) * G):
                    out[h, 0, s] = KQ_ONE(q0 + h * HD * 4, k0 + s * k.strides[1], HD // (4 * PW))
        return out
    for ht in prange(H * T):
        h, t = ht // T, ht % T
        q0, k0 = qh.ctypes.data + (t * H + h) * HD * 4, k.ctypes.data + (h // G) * k.strides[0]
        for s in range(S):
            out[h, t, s] = KQ_MANY(q0, k0 + s * k.strides[1], HD // PW)
    return out


@intrinsic
def axpy_exact(typingctx, y, x, a, n):
    """(y, x, a, n): y[i] += a * x[i] for n chunks of 64 float32 values at addresses y and x (float16 values: each
    product is exact, so this is ggml's fma too)."""
    def codegen(context, builder, signature, args):
        y, x, a, n = args

        def chunk(c, _):
            at = builder.mul(c, ir.Constant(I64, 256))
            yp = builder.inttoptr(builder.add(y, at), V64F32.as_pointer())
            prod = builder.fmul(splat(builder, a, V64F32), load(builder, builder.add(x, at), V64F32))
            builder.store(builder.fadd(builder.load(yp, align=4), prod), yp, align=4)
            return []

        counted_loop(builder, n, [], chunk)
        return context.get_dummy_value()

    return types.none(types.int64, types.int64, types.float32, types.int64), codegen


def _mix_ir(p, v):  # [H, T, S] f32, [KVH, S, HD] f32 (float16 values; HD % 64 == 0, rows contiguous) -> [T, H, HD]
    """_f16_sums' order (4 PW lanes over the keys for one token, PW for a batch; llama.cpp's zero padding adds
    nothing), each lane's row of HD sums accumulated in IR."""
    H, T, S = p.shape
    KVH, _, HD = v.shape
    W = 4 * PW if T == 1 else PW
    out = np.empty((T, H, HD), np.float32)
    for ht in prange(H * T):
        h, t = ht // T, ht % T
        lanes = np.zeros((W, HD), np.float32)
        used = S
        while used > 0 and p[h, t, used - 1] == 0:  # a causal row's unseen keys: zeros add nothing to any lane
            used -= 1
        y0, v0 = lanes.ctypes.data, v.ctypes.data + (h // (H // KVH)) * v.strides[0]
        for s in range(used):
            axpy_exact(y0 + (s % W) * HD * 4, v0 + s * v.strides[1], _round_f16(p[h, t, s]), HD // 64)
        if T == 1:
            _fold(lanes, PW)
        _reduce_rows(lanes, PW, HADD8 and T == 1)
        out[t, h] = lanes[0]
    return out


def _scores_f16(q, k):  # [T, H, HD] f32, [KVH, S, HD] f32 (float16 values) -> [H, T, S]
    """A batch: K transposed once, then _f16_sums along S. One token: each key's dot written out in the same
    order, reading K as stored (a transposed copy per step costs more than the step's sums)."""
    T, H, HD = q.shape
    KVH, S, _ = k.shape
    out = np.empty((H, T, S), np.float32)
    qh = np.empty((T, H, HD), np.float32)
    for t in range(T):
        for h in range(H):
            for d in range(HD):
                qh[t, h, d] = _round_f16(q[t, h, d])
    if T > 1:
        kt = np.empty((KVH, HD, S), np.float32)
        for g in prange(KVH):
            for s in range(S):
                for d in range(HD):
                    kt[g, d, s] = k[g, s, d]
        for ht in prange(H * T):
            h, t = ht // T, ht % T
            _f16_sums(qh[t, h], kt[h // (H // KVH)], out[h, t], HD % PW == 0, False, PW, HADD8)  # else tinyBLAS
        return out  # declines
    W = 4 * PW
    body = HD - HD % W
    for h in prange(H):
        acc = np.zeros((W, 1), np.float32)
        for s in range(S):
            row = k[h // (H // KVH), s]
            acc[:] = 0.0
            for c in range(0, body, W):
                for lane in range(W):
                    acc[lane, 0] += qh[0, h, c + lane] * row[c + lane]
            _fold(acc, PW)
            _reduce_rows(acc, PW, HADD8)
            total = np.float64(acc[0, 0])
            for d in range(body, HD):
                total += np.float64(qh[0, h, d] * row[d])
            out[h, 0, s] = np.float32(total)
    return out


def _mix_f16(p, vf):  # [H, T, S] f32, [KVH, S, HD] f32 (float16 values) -> [T, H, HD]
    H, T, S = p.shape
    KVH, _, HD = vf.shape
    out = np.empty((T, H, HD), np.float32)
    for ht in prange(H * T):
        h, t = ht // T, ht % T
        ph = np.empty(S, np.float32)
        for s in range(S):
            ph[s] = _round_f16(p[h, t, s])
        _f16_sums(ph, vf[h // (H // KVH)], out[t, h], T > 1, True, PW, HADD8)  # llama.cpp pads S to 256 with zeros
    return out


def _f32_dots(x, w):  # [T, K] f32, [N, K] f32 -> [T, N]: ggml_float.f32_dots (which says whose sums these are)
    T, K = x.shape
    N = w.shape[0]
    many = T > 1 and K % PW == 0 and N % 4 == 0
    body = K if many else K - K % (4 * PW)
    out = np.empty((T, N), np.float32)
    for n in prange(N):
        for t in range(T):
            xt, wn = x[t:], w[n:]  # taken in the loop: the arrays stay alive
            total = np.float32(0.0)
            if many:
                total = F32_MANY(xt.ctypes.data, wn.ctypes.data, K // PW)
            elif body:
                total = F32_ONE(xt.ctypes.data, wn.ctypes.data, body // (4 * PW))
            for i in range(body, K):
                total = total + x[t, i] * w[n, i]
            out[t, n] = total
    return out


def _router_softmax(x):  # [T, n] f32 -> [T, n]: ggml_float.softmax (which says whose steps these are)
    T, n = x.shape
    body = n - n % PW
    out = np.empty_like(x)
    group = np.empty(PW, np.float32)
    for t in range(T):
        top = x[t].max()
        total = 0.0  # float64, as ggml_float
        for g in range(0, body, PW):
            for lane in range(PW):
                group[lane] = out[t, g + lane] = EXPF(x[t, g + lane] - top)
            total += _halves(group, PW)
        for i in range(body, n):
            out[t, i] = math.exp(x[t, i] - top)  # float32: the C library's expf
            total += out[t, i]
        scale = np.float32(1.0 / total)
        for i in range(n):
            out[t, i] *= scale
    return out


def _gated_delta_net(q, k, v, g, beta, state):  # ggml_float.gated_delta_net (which says whose steps these are)
    """Each row of a head's state on its own through all the tokens, written in place into the new state: a row's
    steps read no other row, so its 512 bytes stay in L1 and the state is read and written once."""
    T, H, dk = q.shape
    dv = v.shape[2]
    body = dk - dk % (4 * PW)
    scale = np.float32(1.0) / np.sqrt(np.float32(dk))
    decay = np.empty((T, H), np.float32)
    for t in range(T):
        for h in range(H):
            decay[t, h] = math.exp(g[t, h])  # float32: the C library's expf
    out = np.empty((T, H, dv), np.float32)
    new = np.empty((H, dv, dk), np.float32)
    for h in prange(H):
        for j in range(dv):
            sj = new[h, j]
            sj[:] = state[h, j]
            for t in range(T):
                kt, qt = k[t, h], q[t, h]
                for i in range(dk):
                    sj[i] *= decay[t, h]
                recall = F32_ONE(sj.ctypes.data, kt.ctypes.data, body // (4 * PW)) if body else np.float32(0.0)
                for i in range(body, dk):
                    recall = recall + sj[i] * kt[i]
                delta = (v[t, h, j] - recall) * beta[t, h]
                for i in range(dk):
                    sj[i] = fma32(kt[i], delta, sj[i])  # ggml_vec_mad_f32
                read = F32_ONE(sj.ctypes.data, qt.ctypes.data, body // (4 * PW)) if body else np.float32(0.0)
                for i in range(body, dk):
                    read = read + sj[i] * qt[i]
                out[t, h, j] = read * scale
    return out, new


def _ssm_conv(xs, w, fused):  # [CK-1+T, C], [C, CK] -> [T, C]: ggml_float.ssm_conv (which says whose sums these are)
    K = w.shape[1]
    T, C = xs.shape[0] - (K - 1), w.shape[0]
    out = np.empty((T, C), np.float32)
    for t in prange(T):
        for c in range(C):
            total = np.float32(0.0)
            for j in range(K):
                total = fma32(xs[t + j, c], w[c, j], total) if fused else total + xs[t + j, c] * w[c, j]
            out[t, c] = total
    return out


def ssm_conv(x, state, w, path=AVX512):  # as ggml_float.ssm_conv, its channels in parallel
    xs = np.concatenate([state, x], axis=0).astype(np.float32, copy=False)  # [CK-1+T, C]
    w = np.ascontiguousarray(w, dtype=np.float32)
    return PATH_KERNELS[path]["ssm_conv"](xs, w, ggml_float.LANES[path].conv_fused), xs[len(x):]


def silu(x, path=AVX512):  # [..., n] -> [..., n]: ggml_vec_silu_f32, as swiglu's kernel computes silu(x) times 1
    rows = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    return PATH_KERNELS[path]["swiglu"](rows, np.ones_like(rows)).reshape(x.shape)


def gated_delta_net(q, k, v, g, beta, state, path=AVX512):  # ggml_float.gated_delta_net, its heads in parallel
    c = np.ascontiguousarray
    return PATH_KERNELS[path]["gated_delta_net"](c(q, np.float32), c(k, np.float32), c(v, np.float32),
                                                 c(g, np.float32), c(beta, np.float32), c(state, np.float32))


def _path_kernels(path):
    """The kernels above compiled with a path's lanes, expf and sums."""
    pw, avx2 = ggml_float.LANES[path].width, path == "avx2"
    values = dict(PW=pw, EXPF=expf_avx2 if avx2 else expf, HADD8=avx2, KQ_ONE=_kq_dot(pw, parts=4, hadd8=avx2),
                  KQ_MANY=_kq_dot(pw), F32_ONE=_kq_dot(pw, parts=4, fused=True, hadd8=avx2),
                  F32_MANY=_kq_dot(pw, fused=True))
    tag = path.replace("-", "_")
    return {f.__name__[1:]: specialize(f, f"{f.__name__[1:]}_{tag}", parallel=f is not _router_softmax, **values)
            for f in (_swiglu, _softmax, _scores_ir, _mix_ir, _scores_f16, _mix_f16, _f32_dots, _router_softmax,
                      _gated_delta_net, _ssm_conv)}


PATH_KERNELS = {path: _path_kernels(path) for path in EMULATED["numba"]}  # compiled on a first call


class NumbaF32Matrix(F32Matrix):
    """A float32 matrix (a router) whose products are _f32_dots on its path: llama.cpp's sums, without NumPy's
    passes."""

    def __init__(self, w, path=AVX512):
        super().__init__(np.ascontiguousarray(w, dtype=np.float32), path)

    def matmul(self, x, batch=True):  # not a `batch`: mul_mat_id's rows, ggml_vec_dot_f32 one at a time
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, self.shape[1])
        dots = PATH_KERNELS[self.path]["f32_dots"]
        return dots(x, self.w) if batch else np.concatenate([dots(x[i:i + 1], self.w) for i in range(len(x))])


class NumbaF16Matrix(F16Matrix):
    """A float16 matrix whose products are the attention kernels' float16 sums (attention_scores, one "head" of K
    dims): tinyBLAS's order for a batch, ggml_vec_dot_f16's for a token, as llama.cpp's and f16_dots'."""

    def matmul(self, x, batch=True):  # not a `batch`: mul_mat_id's rows, one at a time
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, 1, self.shape[1])  # [T, 1, K]: one head
        w = self.w.astype(np.float32)[None]  # [1, N, K]
        if batch:
            return attention_scores(x, w, self.path)[0]
        return np.concatenate([attention_scores(x[i:i + 1], w, self.path)[0] for i in range(len(x))])


# ggml_numerics' elementwise and attention steps and the router's softmax as Numba kernels, on a CPU path (this
# module's OPS table is the AVX-512 one's; tests/test_ops.py and tests/test_ggml_numerics.py hold every path's
# bit-equal to the NumPy forms)
def router_softmax(x, path=AVX512):  # [..., n] f32 -> [..., n]
    rows = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    return PATH_KERNELS[path]["router_softmax"](rows).reshape(x.shape)


def swiglu(gate, up, path=AVX512):  # [T, F], [T, F] -> [T, F]
    # views as they are (a batch's gate and up: the fused product's columns): their copies cost more than the kernel
    return PATH_KERNELS[path]["swiglu"](gate, up)


def attention_weights(kq, mask, scale, sinks=None, path=AVX512):  # [H, T, S], [T, S], [H] -> [H, T, S]
    sinks = np.zeros(0, np.float32) if sinks is None else np.ascontiguousarray(sinks, dtype=np.float32)
    return PATH_KERNELS[path]["softmax"](kq, np.ascontiguousarray(mask, dtype=np.float32), np.float32(scale), sinks)


def attention_scores(q, k, path=AVX512):  # [T, H, HD] f32, [KVH, S, HD] f32 (float16 values) -> [H, T, S]
    if q.shape[2] % (4 * ggml_float.LANES[path].width) == 0 and k.strides[2] == 4:  # each key's dot in IR, K read
        return PATH_KERNELS[path]["scores_ir"](_round_f16s(np.ascontiguousarray(q)), k)  # in place
    return PATH_KERNELS[path]["scores_f16"](np.ascontiguousarray(q), k)


def attention_mix(p, v, path=AVX512):  # [H, T, S] f32, [KVH, S, HD] f32 (float16 values) -> [T, H*HD]
    if v.shape[2] % 64 == 0 and v.strides[2] == 4:  # the sums in IR, V read in place
        return PATH_KERNELS[path]["mix_ir"](np.ascontiguousarray(p), v).reshape(p.shape[1], -1)
    return PATH_KERNELS[path]["mix_f16"](p, v).reshape(p.shape[1], -1)


# numerics "ggml" on numba: ggml's RMSNorm and RoPE are numba_ops' own; GELU is a table lookup (NumPy is fast)
OPS = Ops(rms_norm=rms_norm, rope=ROPE, rope_cos_sin=rope_cos_sin, attention_scores=attention_scores,
          attention_weights=attention_weights, attention_mix=attention_mix, swiglu=swiglu, gelu=gelu, geglu=geglu,
          softcap=softcap, kv_f16=True, q_first=True, mla_absorbed=True,
          softmax=router_softmax, silu=silu, layer_norm=layer_norm,  # GPT-2's norms: NumPy's
          mul_mat_id=partial(mul_mat_id, product=id_product), sigmoid=sigmoid, softplus=softplus, l2_norm=l2_norm,
          ssm_conv=ssm_conv, gated_delta_net=gated_delta_net,  # the linear attention's sigmoid, softplus: NumPy's
          swiglu_oai=ggml_float.swiglu_oai)  # gpt-oss's: NumPy's, expf Numba's vectorized C library call


def path_ops(path):
    """OPS on a CPU path: its lanes and expf (ggml_float.LANES) in every small step."""
    if path == AVX512:
        return OPS
    steps = (attention_scores, attention_weights, attention_mix, swiglu, router_softmax, gated_delta_net, ssm_conv)
    return OPS._replace(**{f.__name__.replace("router_", ""): partial(f, path=path) for f in steps},
                        silu=partial(silu, path=path), layer_norm=partial(layer_norm, path=path))


class GgmlNumbaPlacement(GgmlPlacement):
    """numerics "ggml" on numba: Q4_0, Q4_1, Q5_0 and Q8_0 matrices as NumbaGgmlMatrix, the K-quants as
    NumbaKQuantMatrix, Q5_1 as GgmlMatrix, F32 and F16 matrices as NumbaF32Matrix and NumbaF16Matrix on the
    placement's path. Quantized
    products are the same on every x86 path: their integer sums are exact, their float steps are the same code."""

    def prepare(self, qtypes, cfg):
        """Load the kernels of the file's matrix types, of a step's small steps and of the cache's RoPE angles
        (sincosf) before the weights are read; then release the pages that only loading them needed."""
        super().prepare(qtypes, cfg)
        x = np.zeros((2, 256), np.float32)
        with compile_notice():
            for qtype in set(qtypes) & {*BLOCK_BYTES, *K_QUANTS}:  # each matrix class this placement makes,
                for rows in (1, 8):  # in both forms where a type is repacked (8 rows)
                    w = QuantizedTensor(np.zeros(byte_shape((rows, 256), qtype), np.uint8), qtype, (rows, 256))
                    _ = x @ self(w).T, x[:1] @ self(w).T
            f32 = NumbaF32Matrix(np.zeros((4, 256), np.float32), self.path)
            _ = x @ f32.T, x[:1] @ f32.T  # F32: both forms
            ops = path_ops(self.path)
            ops.softmax(x)
            warm_up_steps(ops, cfg.head_dim)
            cos_sin(x)
        release_loader_pages()

    def __call__(self, a):
        repack = self.repack and repacked(a.qtype, a.shape, self.path) is not None if isinstance(
            a, QuantizedTensor) else False
        if isinstance(a, QuantizedTensor) and a.qtype in {*BLOCK_BYTES, *K_QUANTS} and (
                repack or a.qtype != QT.MXFP4):  # MXFP4's vec_dot: numerics.ggml_x86's
            m = (NumbaGgmlMatrix if a.qtype in BLOCK_BYTES else NumbaKQuantMatrix)([a.raw], a.qtype, a.shape[1])
            m.repacked = repack
            return m
        m = super().__call__(a)
        if isinstance(m, F16Matrix):
            return NumbaF16Matrix(m.w, np, self.path)
        return NumbaF32Matrix(m.w, self.path) if isinstance(m, F32Matrix) else m

    def layer(self, lw):
        fuse_layer(lw, concat_blocks)
        map_experts(lw)
