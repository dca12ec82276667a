"""refllama.numba_ops (numerics float32 on --backend numba): one token's small steps as Numba kernels, against
refllama.layers' NumPy forms of the same float32 arithmetic."""

import numpy as np
import pytest

from refllama import layers, numba_ops

rng = np.random.default_rng(0)


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("T", [1, 3])
def test_rms_norm_is_layers_to_the_bit(T):
    x, w = randn(T, 576) * 3, randn(576)
    assert np.array_equal(numba_ops.rms_norm(x, w, 1e-5), layers.rms_norm(x, w, 1e-5))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("rope_dim", [64, 32], ids=["full", "partial"])
def test_rope_equals_layers(layout, rope_dim):  # ggml's fused multiply-adds: within an ulp
    x, cos, sin = randn(2, 3, 64), randn(2, rope_dim // 2), randn(2, rope_dim // 2)
    np.testing.assert_allclose(numba_ops.ROPE[layout](x, cos, sin), layers.ROPE[layout](x, cos, sin), rtol=1e-6,
                               atol=1e-6)


def attention(ops, q, k, v, mask):  # scores, softmax weights, mix
    kq = ops.attention_scores(q, k)
    p = ops.attention_weights(kq, mask, 0.125)
    return kq, p, ops.attention_mix(p, v)


@pytest.mark.parametrize("S", [1, 37, 300], ids=["first", "middle", "whole-cache"])
@pytest.mark.parametrize("HD", [64, 128, 96])  # 96: the mix is not whole 64-lane chunks, so NumPy's
def test_one_token_attention_equals_layers(HD, S):
    K, V = randn(3, 300, HD), randn(3, 300, HD)  # a cache of 300 positions; S of them cached
    q, mask = randn(1, 9, HD), layers.causal_mask(S - 1, 1, S, np)
    got = attention(numba_ops, q, K[:, :S], V[:, :S], mask)
    want = attention(layers, q, K[:, :S], V[:, :S], mask)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * np.abs(w).max())  # float32 sums in another order


def test_a_batch_is_layers_itself():
    K, V, q = randn(3, 20, 64), randn(3, 20, 64), randn(4, 9, 64)
    mask = layers.causal_mask(16, 4, 20, np)
    for g, w in zip(attention(numba_ops, q, K, V, mask), attention(layers, q, K, V, mask)):
        assert np.array_equal(g, w)


def test_warm_up_loads_every_layout_a_step_passes():
    numba_ops.warm_up(64)
    kernels = (numba_ops._scores1, numba_ops._mix1, numba_ops._softmax1)
    before = [len(k.signatures) for k in kernels]
    K = randn(3, 8, 64)
    for S in (5, 8):  # part of the cache (strided), all of it (contiguous)
        attention(numba_ops, randn(1, 9, 64), K[:, :S], K[:, :S], layers.causal_mask(S - 1, 1, S, np))
    assert [len(k.signatures) for k in kernels] == before
