"""Qwen3: Qwen2 without the q/k/v biases, plus a per-head RMSNorm of q and k before RoPE (`attn_q_norm`,
`attn_k_norm`, stages `Qcur_normed`/`Kcur_normed` as llama.cpp names them), and a head_dim of its own (not D/H).
Its attention block adds stages, so it is its own; the rest of the forward is llama's."""

from functools import partial

from ..layers import linear, rms_norm, rope_for
from ..trace import tap
from . import llama
from .common import Weight, gguf_config, hf_config, refuse

NAME = "qwen3"
HF_ARCHITECTURES = ("Qwen3ForCausalLM",)
ROPE_LAYOUT = "half"  # NEOX, as Qwen2

WEIGHTS = llama.WEIGHTS[:3]
LAYER_WEIGHTS = (
    Weight("attn_norm", "D", "attn_norm.weight", "input_layernorm.weight"),
    Weight("attn_q", "H*HD, D", "attn_q.weight", "self_attn.q_proj.weight"),
    Weight("attn_k", "KVH*HD, D", "attn_k.weight", "self_attn.k_proj.weight"),
    Weight("attn_v", "KVH*HD, D", "attn_v.weight", "self_attn.v_proj.weight"),
    Weight("attn_q_norm", "HD", "attn_q_norm.weight", "self_attn.q_norm.weight"),
    Weight("attn_k_norm", "HD", "attn_k_norm.weight", "self_attn.k_norm.weight"),
    Weight("attn_output", "D, H*HD", "attn_output.weight", "self_attn.o_proj.weight"),
    Weight("ffn_norm", "D", "ffn_norm.weight", "post_attention_layernorm.weight"),
    Weight("ffn_gate", "F, D", "ffn_gate.weight", "mlp.gate_proj.weight"),
    Weight("ffn_up", "F, D", "ffn_up.weight", "mlp.up_proj.weight"),
    Weight("ffn_down", "D, F", "ffn_down.weight", "mlp.down_proj.weight"),
)
INPUTS = llama.INPUTS
STAGES = ("attn_norm", "Qcur", "Kcur", "Vcur", "Qcur_normed", "Kcur_normed", *llama.STAGES[4:])


def config_from_gguf(g):
    return gguf_config(g, ROPE_LAYOUT)


def config_from_hf(c):
    refuse(c, "use_sliding_window", "Qwen3")
    refuse(c, "attention_bias", "Qwen3")
    return hf_config(c, NAME, ROPE_LAYOUT)


def attention_block(x, lw, cfg, i, start_pos, cache, cos, sin, mask):  # [T, D] -> [T, D]
    T = len(x)
    H, KVH, HD = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    rope = rope_for(cfg)
    h = tap("attn_norm", i, rms_norm(x, lw["attn_norm"], cfg.rms_eps))  # [T, D]
    q = tap("Qcur", i, linear(h, lw["attn_q"]).reshape(T, H, HD))  # [T, H, HD]
    k = tap("Kcur", i, linear(h, lw["attn_k"]).reshape(T, KVH, HD))  # [T, KVH, HD]
    v = tap("Vcur", i, linear(h, lw["attn_v"]).reshape(T, KVH, HD))
    q = tap("Qcur_normed", i, rms_norm(q, lw["attn_q_norm"], cfg.rms_eps))  # each head normed over its HD dims
    k = tap("Kcur_normed", i, rms_norm(k, lw["attn_k_norm"], cfg.rms_eps))
    q = tap("Qcur_rope", i, rope(q, cos, sin))
    k = tap("Kcur_rope", i, rope(k, cos, sin))
    return llama.attend(q, k, v, lw, cfg, i, start_pos, cache, mask)


forward = partial(llama.forward, attention=attention_block)
