"""The Llama forward pass, top to bottom: embeddings, n_layer blocks of attention + SwiGLU, norm, logits.

Each stage is handed to `tap` under llama.cpp's graph name (a no-op unless a trace is recording); where
llama.cpp gives two tensors one name, refllama adds a suffix (`Qcur_rope`, `Kcur_rope`).
"""

from .layers import (attention_mix, attention_scores, attention_weights, causal_mask, embedding, linear,
                     rms_norm, rope_half, rope_interleaved, swiglu)
from .trace import tap
from .xp import array_module

ROPE = {"interleaved": rope_interleaved, "half": rope_half}


def forward(w, cfg, tokens, start_pos, cache, last_only=False):  # [T] -> [T or 1, V] float32 logits
    """Run T new tokens at positions start_pos.. through the model, writing their K/V into cache.

    Prefill passes the whole prompt at once (matrix-matrix); decode passes one token.
    `last_only` computes logits for the last position only (all that generation needs).
    """
    T = len(tokens)
    cache.check_room(T)
    xp = array_module(w["token_embd"])
    cos, sin = cache.cos[start_pos:start_pos + T], cache.sin[start_pos:start_pos + T]  # [T, R/2]
    mask = causal_mask(start_pos, T, start_pos + T, xp, cfg.sliding_window)  # [T, S]

    x = tap("inp_embd", None, embedding(xp.asarray(tokens), w["token_embd"]))  # [T, D]
    for i, lw in enumerate(w["layers"]):
        x = tap("ffn_inp", i, x + attention_block(x, lw, cfg, i, start_pos, cache, cos, sin, mask))  # [T, D]
        x = tap("l_out", i, x + feed_forward_block(x, lw, cfg, i))  # [T, D]
    cache.n_past = start_pos + T

    if last_only:
        x = x[-1:]  # [1, D]
    x = tap("result_norm", None, rms_norm(x, w["output_norm"], cfg.rms_eps))  # [T, D]
    return tap("result_output", None, linear(x, w["output"]))  # [T, V]


def attention_block(x, lw, cfg, i, start_pos, cache, cos, sin, mask):  # [T, D] -> [T, D], layer i's attention
    T = len(x)
    H, KVH, HD = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    rope = ROPE[cfg.rope_layout]
    h = tap("attn_norm", i, rms_norm(x, lw["attn_norm"], cfg.rms_eps))  # [T, D]
    q = tap("Qcur", i, linear(h, lw["attn_q"], lw.get("attn_q_bias")).reshape(T, H, HD))  # [T, H, HD]
    k = tap("Kcur", i, linear(h, lw["attn_k"], lw.get("attn_k_bias")).reshape(T, KVH, HD))  # [T, KVH, HD]
    v = tap("Vcur", i, linear(h, lw["attn_v"], lw.get("attn_v_bias")).reshape(T, KVH, HD))  # Qwen2: biases
    q = tap("Qcur_rope", i, rope(q, cos, sin))
    k = tap("Kcur_rope", i, rope(k, cos, sin))
    k_all, v_all = cache.store(i, start_pos, k, v)  # [KVH, S, HD] each, S = start_pos + T
    kq = tap("kq", i, attention_scores(q, k_all))  # [H, T, S]
    p = tap("kq_soft_max", i, attention_weights(kq, mask, HD))  # [H, T, S]
    attn = tap("kqv_out", i, attention_mix(p, v_all))  # [T, H*HD]
    return tap("attn_out", i, linear(attn, lw["attn_output"], lw.get("attn_output_bias")))  # [T, D]


def feed_forward_block(x, lw, cfg, i):  # [T, D] -> [T, D], layer i's SwiGLU feed-forward
    h = tap("ffn_norm", i, rms_norm(x, lw["ffn_norm"], cfg.rms_eps))  # [T, D]
    gate = tap("ffn_gate", i, linear(h, lw["ffn_gate"], lw.get("ffn_gate_bias")))  # [T, F]
    up = tap("ffn_up", i, linear(h, lw["ffn_up"], lw.get("ffn_up_bias")))  # [T, F]
    h = tap("ffn_swiglu", i, swiglu(gate, up))  # [T, F]
    return tap("ffn_out", i, linear(h, lw["ffn_down"], lw.get("ffn_down_bias")))  # [T, D]
