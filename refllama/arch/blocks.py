"""The stages the architectures build their forwards from, as llama.cpp's src/models/*.cpp build theirs from
build_norm, build_attn and build_ffn: each a pure function of arrays and a layer's weights, each stage handed to
`tap` under llama.cpp's graph name. `ops` is the numerics' operations table (refllama.layers.Ops): the steps whose
arithmetic a numerics chooses are always called through it.

`pre_norm_forward` is the forward of Llama and of the families that differ from it only in data (Qwen2's biases,
Phi-3's fused matrices split at load, Qwen3's per-head q/k norms): embeddings, n_layer blocks of attention and a
SwiGLU feed-forward, each after an RMSNorm and added to the residual, a last norm, logits.
"""

from typing import NamedTuple

from ..layers import causal_mask, embedding, linear
from ..trace import tap
from ..xp import array_module

PRE_NORM_INPUTS = ("inp_embd",)  # the stages pre_norm_forward taps before the first block, and in each block:
PRE_NORM_STAGES = ("attn_norm", "Qcur", "Kcur", "Vcur", "Qcur_rope", "Kcur_rope", "kq", "kq_soft_max", "kqv_out",
                   "attn_out", "ffn_inp", "ffn_norm", "ffn_gate", "ffn_up", "ffn_swiglu", "ffn_out", "l_out")
QK_NORM_STAGES = ("Qcur_normed", "Kcur_normed")  # qk_norm's, after Vcur (Qwen3, Gemma 3)


class At(NamedTuple):
    """Where a step's T tokens are: their first position, the cache, their rows of the RoPE tables, their mask."""

    start_pos: int
    cache: object  # refllama.cache.Cache
    cos: object  # [T, R/2]
    sin: object  # [T, R/2]
    mask: object  # [T, S], S = start_pos + T


def positions(cache, start_pos, T, xp, window=None, local=False):  # -> At of T tokens from start_pos
    """`window`: a query sees only its last `window` keys; `local`: the RoPE tables of the sliding-window layers
    (Gemma 3's local layers have a base of their own)."""
    span = slice(start_pos, start_pos + T)
    cos, sin = (cache.cos_swa, cache.sin_swa) if local else (cache.cos, cache.sin)
    return At(start_pos, cache, cos[span], sin[span], causal_mask(start_pos, T, start_pos + T, xp, window))


def qkv(h, lw, cfg, i):  # [T, D] -> q [T, H, HD], k [T, KVH, HD], v [T, KVH, HD]: the projections, biases if any
    T = len(h)
    q = tap("Qcur", i, linear(h, lw["attn_q"], lw.get("attn_q_bias")).reshape(T, cfg.n_head, cfg.head_dim))
    k = tap("Kcur", i, linear(h, lw["attn_k"], lw.get("attn_k_bias")).reshape(T, cfg.n_head_kv, cfg.head_dim))
    v = tap("Vcur", i, linear(h, lw["attn_v"], lw.get("attn_v_bias")).reshape(T, cfg.n_head_kv, cfg.head_dim))
    return q, k, v


def qk_norm(q, k, lw, cfg, ops, i):  # [T, H, HD], [T, KVH, HD] -> same: each head RMS-normed over its HD dims
    q = tap("Qcur_normed", i, ops.rms_norm(q, lw["attn_q_norm"], cfg.rms_eps))
    k = tap("Kcur_normed", i, ops.rms_norm(k, lw["attn_k_norm"], cfg.rms_eps))
    return q, k


def rope_qk(q, k, cfg, ops, at, i):  # [T, H, HD], [T, KVH, HD] -> same, rotated by position in the model's pairs
    rope = ops.rope[cfg.rope_layout]
    return tap("Qcur_rope", i, rope(q, at.cos, at.sin)), tap("Kcur_rope", i, rope(k, at.cos, at.sin))


def attend(q, k, v, lw, cfg, ops, i, at):  # q [T, H, HD], k, v [T, KVH, HD] -> [T, D]
    """Store k and v, then scores, softmax, weighted values and the output projection."""
    k_all, v_all = at.cache.store(i, at.start_pos, k, v)  # [KVH, S, HD] each
    if ops.q_first:  # llama.cpp's graph: q times the scale (float32), then q.k; the stage stays q.k unscaled
        scale = array_module(q).float32(cfg.kq_scale)
        kq = ops.attention_scores(q * scale, k_all)  # [H, T, S]
        tap("kq", i, kq / scale)
        p = tap("kq_soft_max", i, ops.attention_weights(kq, at.mask, 1.0))  # [H, T, S]
    else:
        kq = tap("kq", i, ops.attention_scores(q, k_all))  # [H, T, S]
        p = tap("kq_soft_max", i, ops.attention_weights(kq, at.mask, cfg.kq_scale))  # [H, T, S]
    attn = tap("kqv_out", i, ops.attention_mix(p, v_all))  # [T, H*HD]
    return tap("attn_out", i, linear(attn, lw["attn_output"], lw.get("attn_output_bias")))  # [T, D]


def gated_ffn(h, lw, ops, unit, i):  # [T, D] -> [T, D]: down(unit(gate(h), up(h))), biases if any
    """`unit`: "swiglu" (SiLU gate: Llama, Qwen, Phi-3) or "geglu" (GELU gate: Gemma), its stage `ffn_{unit}`."""
    gate = tap("ffn_gate", i, linear(h, lw["ffn_gate"], lw.get("ffn_gate_bias")))  # [T, F]
    up = tap("ffn_up", i, linear(h, lw["ffn_up"], lw.get("ffn_up_bias")))  # [T, F]
    h = tap(f"ffn_{unit}", i, getattr(ops, unit)(gate, up))  # [T, F]
    return tap("ffn_out", i, linear(h, lw["ffn_down"], lw.get("ffn_down_bias")))  # [T, D]


def pre_norm_forward(w, cfg, ops, tokens, start_pos, cache, last_only=False):  # [T] -> [T or 1, V] logits
    """Run T new tokens at positions start_pos.. through the model, writing their K/V into cache.

    Prefill passes the whole prompt at once (matrix-matrix); decode passes one token. `last_only` computes logits
    for the last position only (all that generation needs): the last block keeps only that row once attention has
    run, where llama.cpp's graphs pick their output rows (inp_out_ids), so its feed-forward runs on one token.
    """
    T = len(tokens)
    cache.check_room(T)
    xp = array_module(w["token_embd"])
    at = positions(cache, start_pos, T, xp, cfg.sliding_window)

    x = tap("inp_embd", None, embedding(xp.asarray(tokens), w["token_embd"]))  # [T, D]
    for i, lw in enumerate(w["layers"]):
        x = pre_norm_block(x, lw, cfg, ops, i, at, last_only and i == cfg.n_layer - 1)  # [T, D] (last: [1, D])
    cache.n_past = start_pos + T

    x = tap("result_norm", None, ops.rms_norm(x, w["output_norm"], cfg.rms_eps))  # [T, D]
    return tap("result_output", None, linear(x, w["output"]))  # [T, V]


def pre_norm_block(x, lw, cfg, ops, i, at, last_only=False):  # [T, D] -> [T, D] ([1, D]: last_only), layer i
    h = tap("attn_norm", i, ops.rms_norm(x, lw["attn_norm"], cfg.rms_eps))  # [T, D]
    q, k, v = qkv(h, lw, cfg, i)  # [T, H, HD], [T, KVH, HD], [T, KVH, HD]
    if "attn_q_norm" in lw:  # Qwen3
        q, k = qk_norm(q, k, lw, cfg, ops, i)
    q, k = rope_qk(q, k, cfg, ops, at, i)
    h = attend(q, k, v, lw, cfg, ops, i, at)  # [T, D]
    if last_only:  # only the last row goes on
        x, h = x[-1:], h[-1:]  # [1, D]
    x = tap("ffn_inp", i, x + h)  # [T, D]
    del h, q, k, v  # before the feed-forward's larger arrays
    h = tap("ffn_norm", i, ops.rms_norm(x, lw["ffn_norm"], cfg.rms_eps))  # [T, D]
    return tap("l_out", i, x + gated_ffn(h, lw, ops, "swiglu", i))  # [T, D]
