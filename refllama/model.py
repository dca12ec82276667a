"""The Llama forward pass, top to bottom: embeddings, n_layer blocks of attention + SwiGLU, norm, logits.

Stage names in comments are llama.cpp's graph names, the vocabulary of refllama's checkpoints.
"""

from .layers import attention, causal_mask, embedding, linear, rms_norm, rope_half, rope_interleaved, swiglu
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
    H, KVH, HD = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    rope = ROPE[cfg.rope_layout]
    cos, sin = cache.cos[start_pos:start_pos + T], cache.sin[start_pos:start_pos + T]  # [T, R/2]
    mask = causal_mask(start_pos, T, start_pos + T, xp)  # [T, S]

    x = embedding(xp.asarray(tokens), w["token_embd"])  # inp_embd [T, D]
    for i, lw in enumerate(w["layers"]):
        h = rms_norm(x, lw["attn_norm"], cfg.rms_eps)  # attn_norm [T, D]
        q = linear(h, lw["attn_q"]).reshape(T, H, HD)  # Qcur [T, H, HD]
        k = linear(h, lw["attn_k"]).reshape(T, KVH, HD)  # Kcur [T, KVH, HD]
        v = linear(h, lw["attn_v"]).reshape(T, KVH, HD)  # Vcur [T, KVH, HD]
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k_all, v_all = cache.store(i, start_pos, k, v)  # [KVH, S, HD] each
        attn = attention(q, k_all, v_all, mask)  # kqv_out [T, H*HD]
        x = x + linear(attn, lw["attn_output"])  # ffn_inp [T, D]
        h = rms_norm(x, lw["ffn_norm"], cfg.rms_eps)  # ffn_norm [T, D]
        x = x + swiglu(h, lw["ffn_gate"], lw["ffn_up"], lw["ffn_down"])  # l_out [T, D]
    cache.n_past = start_pos + T

    if last_only:
        x = x[-1:]  # [1, D]
    x = rms_norm(x, w["output_norm"], cfg.rms_eps)  # result_norm [T, D]
    return linear(x, w["output"])  # result_output [T, V]
