"""Layers against their textbook definitions, written out independently here with explicit loops."""

import numpy as np
import pytest

from refllama.arch import permute_qk
from refllama.cache import rope_tables
from refllama.config import ModelConfig
from refllama.layers import (
    attention_mix,
    attention_scores,
    attention_weights,
    causal_mask,
    rms_norm,
    rope_half,
    rope_interleaved,
    softmax,
    swiglu,
)

rng = np.random.default_rng(0)


def cfg(**kw):
    base = dict(arch="llama", n_layer=1, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, n_ff=32, vocab_size=10,
                n_ctx_train=32, rms_eps=1e-5, rope_base=10000.0, rope_dim=16, rope_layout="interleaved")
    return ModelConfig(**{**base, **kw})


def test_rms_norm_definition():
    x, w = rng.standard_normal((3, 8)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    expected = np.stack([row / np.sqrt((row.astype(np.float64) ** 2).mean() + 1e-5) * w for row in x])
    np.testing.assert_allclose(rms_norm(x, w, 1e-5), expected, rtol=1e-6)


def test_rms_norm_uses_eps():
    x = np.full((1, 4), 1e-3, np.float32)
    assert rms_norm(x, np.ones(4, np.float32), 1e-5)[0, 0] == pytest.approx(1e-3 / np.sqrt(1e-6 + 1e-5), rel=1e-5)


def test_rope_interleaved_rotates_adjacent_pairs():
    c = cfg()
    cos, sin = rope_tables(c, 8)
    x = rng.standard_normal((8, 2, 16)).astype(np.float32)
    out = rope_interleaved(x, cos, sin)
    for pos in range(8):
        for i in range(8):
            theta = pos * 10000.0 ** (-2 * i / 16)
            a, b = x[pos, :, 2 * i], x[pos, :, 2 * i + 1]
            np.testing.assert_allclose(out[pos, :, 2 * i], a * np.cos(theta) - b * np.sin(theta), atol=1e-5)
            np.testing.assert_allclose(out[pos, :, 2 * i + 1], a * np.sin(theta) + b * np.cos(theta), atol=1e-5)


def test_rope_layouts_agree_under_the_gguf_permutation():
    """HF's half-split layout is GGUF's interleaved one with each head's dims permuted."""
    cos, sin = rope_tables(cfg(), 5)
    x = rng.standard_normal((5, 3, 16)).astype(np.float32)
    perm = np.concatenate([np.arange(0, 16, 2), np.arange(1, 16, 2)])  # interleaved -> half-split
    np.testing.assert_allclose(rope_half(x[..., perm], cos, sin), rope_interleaved(x, cos, sin)[..., perm], atol=1e-6)


def test_rope_keeps_norm_and_partial_rotation_passes_rest_through():
    c = cfg(rope_dim=8)
    cos, sin = rope_tables(c, 6)
    x = rng.standard_normal((6, 2, 16)).astype(np.float32)
    out = rope_interleaved(x, cos, sin)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    np.testing.assert_array_equal(out[..., 8:], x[..., 8:])


def test_linear_rope_scaling_divides_positions():
    cos4, _ = rope_tables(cfg(rope_scale=4.0), 9)
    cos1, _ = rope_tables(cfg(), 9)
    np.testing.assert_allclose(cos4[8], cos1[2], atol=1e-6)


def test_gqa_attention_equals_per_head_loop_with_repeated_kv():
    T, S, H, KVH, HD = 3, 7, 6, 2, 8
    q = rng.standard_normal((T, H, HD)).astype(np.float32)
    k = rng.standard_normal((KVH, S, HD)).astype(np.float32)
    v = rng.standard_normal((KVH, S, HD)).astype(np.float32)
    mask = causal_mask(S - T, T, S, np)
    out = attention_mix(attention_weights(attention_scores(q, k), mask, HD ** -0.5), v)
    expected = np.zeros((T, H * HD), np.float32)
    for h in range(H):
        kv = h // (H // KVH)  # transformers' repeat_kv: kv head j serves query heads j*G .. j*G+G-1
        for t in range(T):
            visible = S - T + t + 1
            s = k[kv, :visible] @ q[t, h] / np.sqrt(HD)
            p = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            expected[t, h * HD:(h + 1) * HD] = p @ v[kv, :visible]
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_causal_mask_hides_future_keys():
    m = causal_mask(2, 3, 5, np)
    assert np.isneginf(m).tolist() == [[False, False, False, True, True], [False] * 4 + [True], [False] * 5]


def test_softmax_rows_sum_to_one_and_survive_large_values():
    p = softmax(np.array([[1000.0, 1000.0, -np.inf]], np.float32))
    np.testing.assert_allclose(p, [[0.5, 0.5, 0.0]])


def test_swiglu_definition():
    gate, up = rng.standard_normal((2, 3, 5)).astype(np.float32)
    np.testing.assert_allclose(swiglu(gate, up), gate / (1 + np.exp(-gate)) * up, rtol=1e-5, atol=1e-7)
    assert np.isfinite(swiglu(np.array([-1e4, 1e4], np.float32), np.ones(2, np.float32))).all()


@pytest.mark.parametrize("rope_dim", [16, 8])
def test_permute_qk_maps_one_pair_layout_onto_the_other_with_partial_rotary(rope_dim):
    """refllama.arch.permute_qk, the public helper: interleaved -> half and back, the unrotated dims untouched."""
    cos, sin = rope_tables(cfg(rope_dim=rope_dim), 5)
    x = rng.standard_normal((5, 3, 16)).astype(np.float32)
    half = permute_qk(x, "half", rope_dim)
    np.testing.assert_allclose(rope_half(half, cos, sin), permute_qk(rope_interleaved(x, cos, sin), "half", rope_dim),
                               atol=1e-6)
    np.testing.assert_array_equal(permute_qk(half, "interleaved", rope_dim), x)
    np.testing.assert_array_equal(half[..., rope_dim:], x[..., rope_dim:])


def test_gated_delta_net_steps_are_transformers():
    """Qwen3.5's linear attention, step by step, against transformers' own functions on random inputs
    (tools/make_gated_delta_refs.py): q/k L2-normed, the short causal conv (a prefill, then one decode step from
    the state it hands on), the gated delta rule (its chunked prefill form and its recurrence; one more token from
    the state equals the recurrence's step), the gated RMS norm. Each k head serves 2 v heads (HF's grouped order)."""
    from pathlib import Path

    from refllama.layers import causal_conv, gated_delta_rule, l2_norm, rms_norm, silu

    r = np.load(Path(__file__).parent / "data" / "gated_delta_net.npz")
    T, HV = r["chunk_out"].shape[:2]
    tol = dict(rtol=2e-5, atol=2e-6)
    q, k = l2_norm(r["q"], 1e-6), l2_norm(r["k"], 1e-6)
    np.testing.assert_allclose(q, r["l2_q"], **tol)
    grouped = HV // q.shape[1]
    q, k = (np.repeat(x, grouped, axis=1) for x in (q, k))  # [T+1, HV, dk]
    state = np.zeros((HV, r["v"].shape[-1], q.shape[-1]), np.float32)  # llama.cpp's [H, dv, dk]: HF's transposed
    out, state = gated_delta_rule(q[:T], k[:T], r["v"][:T], r["g"][:T], r["beta"][:T], state)
    for form in ("chunk", "rec"):
        np.testing.assert_allclose(out, r[f"{form}_out"], **tol)
        np.testing.assert_allclose(state.transpose(0, 2, 1), r[f"{form}_state"], **tol)
    out, state = gated_delta_rule(q[T:], k[T:], r["v"][T:], r["g"][T:], r["beta"][T:], state)
    np.testing.assert_allclose(out, r["step_out"], **tol)
    np.testing.assert_allclose(state.transpose(0, 2, 1), r["step_state"], **tol)
    w = r["w"]
    y, conv_state = causal_conv(r["x"][:T], np.zeros((w.shape[1] - 1, w.shape[0]), np.float32), w)
    np.testing.assert_allclose(y, r["conv"], **tol)
    y, _ = causal_conv(r["x"][T:], conv_state, w)
    np.testing.assert_allclose(y, r["conv_step"], **tol)
    gated = rms_norm(r["v"][:T], r["norm_w"], 1e-6) * silu(r["z"][:T])  # hybrid.linear_attention's gated norm
    np.testing.assert_allclose(gated, r["gated_norm"], **tol)
