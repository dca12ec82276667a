"""Numerics "float32" on `--backend numba`: a decode step's small steps as Numba kernels.

One token's RMSNorm is six NumPy calls (~9 us), its softmax five (~10 us), each attention product a batched BLAS
call (~7 us): a decode step is ~150 such calls, as long in all as a third of its weight products. Here each is one
kernel call of 1-3 us, in refllama.layers' float32 arithmetic: RMSNorm to the bit, RoPE ggml's (one fused
multiply-add a value: to the bit NumPy's complex64 product where NumPy fuses too), the attention sums in 16- or
64-lane vectors, the softmax's exp ggml's (within an ulp of libm's). A batch (prefill) keeps refllama.layers' NumPy
and BLAS, which are faster there; so do SwiGLU and GELU (NumPy's tanh is vectorized).
"""

import numpy as np
from numba import njit

from . import layers
from .ggml_kernels import ROPE, axpy_exact, expf, kq_dot16, rms_norm  # noqa: F401 (RMSNorm, RoPE: ggml's are these)


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
        total = np.float32(0.0)
        for s in range(S):
            out[h, 0, s] = expf(out[h, 0, s] - top)
            total += out[h, 0, s]
        for s in range(S):
            out[h, 0, s] /= total
    return out


@njit(cache=True)
def _mix1(p, v):  # [H, 1, S], [KVH, S, HD] (HD % 64 == 0, rows contiguous) -> [1, H, HD]
    H, _, S = p.shape
    KVH, _, HD = v.shape
    out = np.zeros((1, H, HD), np.float32)
    for h in range(H):
        y0, v0 = out.ctypes.data + h * HD * 4, v.ctypes.data + (h // (H // KVH)) * v.strides[0]
        for s in range(S):
            axpy_exact(y0, v0 + s * v.strides[1], p[h, 0, s], HD // 64)
    return out


def attention_scores(q, k):  # [T, H, HD], [KVH, S, HD] -> [H, T, S]
    if len(q) > 1 or q.shape[2] % 16 or k.strides[2] != 4:
        return layers.attention_scores(q, k)
    return _scores1(np.ascontiguousarray(q), k)


def attention_weights(kq, mask, scale):  # [H, T, S], [T, S] -> [H, T, S]
    if kq.shape[1] > 1:
        return layers.attention_weights(kq, mask, scale)
    return _softmax1(np.ascontiguousarray(kq), np.ascontiguousarray(mask, dtype=np.float32), np.float32(scale))


def attention_mix(p, v):  # [H, T, S], [KVH, S, HD] -> [T, H*HD]
    if p.shape[1] > 1 or v.shape[2] % 64 or v.strides[2] != 4:
        return layers.attention_mix(p, v)
    return _mix1(np.ascontiguousarray(p), v).reshape(1, -1)


swiglu, gelu, geglu = layers.swiglu, layers.gelu_tanh, layers.geglu  # NumPy's: its tanh is vectorized


