"""Numerics "float32" on --backend numba: the steps of a decode step that gain from a Numba kernel.

RMSNorm (six NumPy calls, ~17 us; one kernel call, ~4 us, 0.8 ms of a SmolLM2 decode step) and one token's softmax
are kernels here, in refllama.layers' arithmetic (RMSNorm to the bit); the rest is refllama.layers' NumPy.
"""

import math

import numpy as np
from numba import njit

from . import layers


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


def rms_norm(x, w, eps):  # [T, D], [D] -> [T, D]
    return _rms_norm(np.ascontiguousarray(x), w, np.float32(eps))


@njit(fastmath=True, cache=True)
def _softmax(kq, mask, scale):  # [H, 1, S], [1, S] -> [H, 1, S]: softmax(scale * kq + mask)
    H, _, S = kq.shape
    out = np.empty_like(kq)
    for h in range(H):
        top = -np.inf
        for s in range(S):
            out[h, 0, s] = kq[h, 0, s] * scale + mask[0, s]
            top = max(top, out[h, 0, s])
        total = np.float32(0.0)
        for s in range(S):
            out[h, 0, s] = math.exp(out[h, 0, s] - top)
            total += out[h, 0, s]
        for s in range(S):
            out[h, 0, s] /= total
    return out


def attention_weights(kq, mask, scale):  # [H, T, S], [T, S] -> [H, T, S]
    if kq.shape[1] > 1:
        return layers.attention_weights(kq, mask, scale)
    return _softmax(np.ascontiguousarray(kq), np.ascontiguousarray(mask, dtype=np.float32), np.float32(scale))


# as in NumPy: the attention products (BLAS on each group's heads beats a loop in Numba on the strided cache), the
# elementwise steps (NumPy's tanh is vectorized, Numba's calls libm per value)
attention_scores, attention_mix, swiglu = layers.attention_scores, layers.attention_mix, layers.swiglu
gelu, geglu, ROPE = layers.gelu_tanh, layers.geglu, layers.ROPE
