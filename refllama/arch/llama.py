"""Llama (and Mistral, and SmolLM2): llama.cpp's `llama` architecture. The forward, top to bottom: embeddings,
n_layer blocks of attention + SwiGLU, norm, logits. Qwen2 and Phi-3 share it; they differ only in data.

Each stage is handed to `tap` under llama.cpp's graph name (a no-op unless a trace is recording); where
llama.cpp gives two tensors one name, refllama adds a suffix (`Qcur_rope`, `Kcur_rope`).
"""

from ..layers import (
    attention_mix,
    attention_scores,
    attention_weights,
    causal_mask,
    embedding,
    linear,
    rms_norm,
    rope_for,
    swiglu,
)
from ..trace import tap
from ..xp import array_module
from .common import Weight, gguf_config, hf_config

NAME = "llama"
HF_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
ROPE_LAYOUT = "interleaved"  # llama.cpp's rope mode NORM; its converter permutes HF's q/k rows to it

WEIGHTS = (  # key, shape, GGUF name, HF name, required
    Weight("token_embd", "V, D", "token_embd.weight", "model.embed_tokens.weight"),
    Weight("output_norm", "D", "output_norm.weight", "model.norm.weight"),
    Weight("output", "V, D", "output.weight", "lm_head.weight", required=False),  # absent: tied to token_embd
    Weight("rope_freqs", "R/2", "rope_freqs.weight", None, required=False),  # Llama 3.1's frequency divisors
)
LAYER_WEIGHTS = (  # a block's, after blk.N. / model.layers.N.
    Weight("attn_norm", "D", "attn_norm.weight", "input_layernorm.weight"),
    Weight("attn_q", "H*HD, D", "attn_q.weight", "self_attn.q_proj.weight", hf_permute="H"),
    Weight("attn_k", "KVH*HD, D", "attn_k.weight", "self_attn.k_proj.weight", hf_permute="KVH"),
    Weight("attn_v", "KVH*HD, D", "attn_v.weight", "self_attn.v_proj.weight"),
    Weight("attn_output", "D, H*HD", "attn_output.weight", "self_attn.o_proj.weight"),
    Weight("ffn_norm", "D", "ffn_norm.weight", "post_attention_layernorm.weight"),
    Weight("ffn_gate", "F, D", "ffn_gate.weight", "mlp.gate_proj.weight"),
    Weight("ffn_up", "F, D", "ffn_up.weight", "mlp.up_proj.weight"),
    Weight("ffn_down", "D, F", "ffn_down.weight", "mlp.down_proj.weight"),
    # Llama's attention_bias and mlp_bias options
    Weight("attn_q_bias", "H*HD", "attn_q.bias", "self_attn.q_proj.bias", required=False, hf_permute="H"),
    Weight("attn_k_bias", "KVH*HD", "attn_k.bias", "self_attn.k_proj.bias", required=False, hf_permute="KVH"),
    Weight("attn_v_bias", "KVH*HD", "attn_v.bias", "self_attn.v_proj.bias", required=False),
    Weight("attn_output_bias", "D", "attn_output.bias", "self_attn.o_proj.bias", required=False),
    Weight("ffn_gate_bias", "F", "ffn_gate.bias", "mlp.gate_proj.bias", required=False),
    Weight("ffn_up_bias", "F", "ffn_up.bias", "mlp.up_proj.bias", required=False),
    Weight("ffn_down_bias", "D", "ffn_down.bias", "mlp.down_proj.bias", required=False),
)
INPUTS = ("inp_embd",)  # the stages before the first block
STAGES = ("attn_norm", "Qcur", "Kcur", "Vcur", "Qcur_rope", "Kcur_rope", "kq", "kq_soft_max", "kqv_out",
          "attn_out", "ffn_inp", "ffn_norm", "ffn_gate", "ffn_up", "ffn_swiglu", "ffn_out", "l_out")


def config_from_gguf(g):
    """A `llama` GGUF; files converted from Mistral may carry `llama.attention.sliding_window`."""
    return gguf_config(g, ROPE_LAYOUT)


def config_from_hf(c):
    """LlamaForCausalLM, or MistralForCausalLM with its sliding window."""
    window = c.get("sliding_window", kind=(int,)) if c.get("architectures")[0] == "MistralForCausalLM" else None
    return hf_config(c, NAME, ROPE_LAYOUT, sliding_window=int(window) if window else None)


def forward(w, cfg, tokens, start_pos, cache, last_only=False, attention=None):  # [T] -> [T or 1, V] logits
    """Run T new tokens at positions start_pos.. through the model, writing their K/V into cache.

    Prefill passes the whole prompt at once (matrix-matrix); decode passes one token.
    `last_only` computes logits for the last position only (all that generation needs). `attention` is the
    attention block, for families whose attention adds stages (Qwen3); the feed-forward block is shared.
    """
    attention = attention or attention_block
    T = len(tokens)
    cache.check_room(T)
    xp = array_module(w["token_embd"])
    cos, sin = cache.cos[start_pos:start_pos + T], cache.sin[start_pos:start_pos + T]  # [T, R/2]
    mask = causal_mask(start_pos, T, start_pos + T, xp, cfg.sliding_window)  # [T, S]

    x = tap("inp_embd", None, embedding(xp.asarray(tokens), w["token_embd"]))  # [T, D]
    for i, lw in enumerate(w["layers"]):
        x = tap("ffn_inp", i, x + attention(x, lw, cfg, i, start_pos, cache, cos, sin, mask))  # [T, D]
        x = tap("l_out", i, x + feed_forward_block(x, lw, cfg, i))  # [T, D]
    cache.n_past = start_pos + T

    if last_only:
        x = x[-1:]  # [1, D]
    x = tap("result_norm", None, rms_norm(x, w["output_norm"], cfg.rms_eps, cfg.numerics))  # [T, D]
    return tap("result_output", None, linear(x, w["output"]))  # [T, V]


def attention_block(x, lw, cfg, i, start_pos, cache, cos, sin, mask):  # [T, D] -> [T, D], layer i's attention
    T = len(x)
    H, KVH, HD = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    rope = rope_for(cfg)
    h = tap("attn_norm", i, rms_norm(x, lw["attn_norm"], cfg.rms_eps, cfg.numerics))  # [T, D]
    q = tap("Qcur", i, linear(h, lw["attn_q"], lw.get("attn_q_bias")).reshape(T, H, HD))  # [T, H, HD]
    k = tap("Kcur", i, linear(h, lw["attn_k"], lw.get("attn_k_bias")).reshape(T, KVH, HD))  # [T, KVH, HD]
    v = tap("Vcur", i, linear(h, lw["attn_v"], lw.get("attn_v_bias")).reshape(T, KVH, HD))  # Qwen2: biases
    q = tap("Qcur_rope", i, rope(q, cos, sin))
    k = tap("Kcur_rope", i, rope(k, cos, sin))
    return attend(q, k, v, lw, cfg, i, start_pos, cache, mask)


def attend(q, k, v, lw, cfg, i, start_pos, cache, mask):  # q [T, H, HD], k, v [T, KVH, HD] -> [T, D]
    """Scores, softmax, weighted values and output projection, after q and k have their positions."""
    k_all, v_all = cache.store(i, start_pos, k, v)  # [KVH, S, HD] each, S = start_pos + T
    kq = tap("kq", i, attention_scores(q, k_all, cfg.numerics))  # [H, T, S]
    p = tap("kq_soft_max", i, attention_weights(kq, mask, cfg.kq_scale, cfg.numerics))  # [H, T, S]
    attn = tap("kqv_out", i, attention_mix(p, v_all, cfg.numerics))  # [T, H*HD]
    return tap("attn_out", i, linear(attn, lw["attn_output"], lw.get("attn_output_bias")))  # [T, D]


def feed_forward_block(x, lw, cfg, i):  # [T, D] -> [T, D], layer i's SwiGLU feed-forward
    h = tap("ffn_norm", i, rms_norm(x, lw["ffn_norm"], cfg.rms_eps, cfg.numerics))  # [T, D]
    gate = tap("ffn_gate", i, linear(h, lw["ffn_gate"], lw.get("ffn_gate_bias")))  # [T, F]
    up = tap("ffn_up", i, linear(h, lw["ffn_up"], lw.get("ffn_up_bias")))  # [T, F]
    h = tap("ffn_swiglu", i, swiglu(gate, up, cfg.numerics))  # [T, F]
    return tap("ffn_out", i, linear(h, lw["ffn_down"], lw.get("ffn_down_bias")))  # [T, D]

