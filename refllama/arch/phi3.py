"""Phi-3: llama's forward on NEOX RoPE pairs, with q, k and v fused in one matrix (`attn_qkv`), gate and up
fused in another (`ffn_up`, gate rows first), both split at load, and LongRoPE: frequency factors for short
and long contexts (`rope_factors_short`/`_long`, chosen by the context size as llama.cpp does) and an
attention factor that scales cos and sin."""

from . import llama
from .common import Weight, gguf_config, hf_config

NAME = "phi3"
HF_ARCHITECTURES = ("Phi3ForCausalLM",)
ROPE_LAYOUT = "half"  # NEOX

WEIGHTS = (
    *llama.WEIGHTS[:3],
    Weight("rope_factors_short", "R/2", "rope_factors_short.weight", None, required=False),
    Weight("rope_factors_long", "R/2", "rope_factors_long.weight", None, required=False),
)
LAYER_WEIGHTS = (
    Weight("attn_norm", "D", "attn_norm.weight", "input_layernorm.weight"),
    Weight("attn_qkv", "H*HD + 2*KVH*HD, D", "attn_qkv.weight", "self_attn.qkv_proj.weight",
           split=(("attn_q", "H*HD"), ("attn_k", "KVH*HD"), ("attn_v", "KVH*HD"))),
    Weight("attn_output", "D, H*HD", "attn_output.weight", "self_attn.o_proj.weight"),
    Weight("ffn_norm", "D", "ffn_norm.weight", "post_attention_layernorm.weight"),
    Weight("ffn_gate_up", "2*F, D", "ffn_up.weight", "mlp.gate_up_proj.weight",
           split=(("ffn_gate", "F"), ("ffn_up", "F"))),
    Weight("ffn_down", "D, F", "ffn_down.weight", "mlp.down_proj.weight"),
)
INPUTS, STAGES = llama.INPUTS, llama.STAGES
forward = llama.forward


def config_from_gguf(g):
    """llama.cpp reads `phi3.attention.sliding_window` and then disables it ("Phi SWA is currently disabled"),
    so refllama does too."""
    return gguf_config(g, ROPE_LAYOUT, sliding_window=None)


def config_from_hf(c):
    """transformers' Phi-3 attention applies `sliding_window` when the config sets one."""
    window = c.get("sliding_window", kind=(int,))
    return hf_config(c, NAME, ROPE_LAYOUT, sliding_window=int(window) if window else None)


# How llama.cpp's phi3 graph differs from these stages, for tools/dump_llamacpp.py: its fused nodes, split by rows
# as the weights are, and its q scaled by 1/sqrt(HD) before kq (so its kq is refllama's divided by sqrt(HD)).
LLAMACPP_FUSED = {"wqkv": ("Qcur", "Kcur", "Vcur"), "ffn_up": ("ffn_gate", "ffn_up")}
LLAMACPP_Q_SCALED = True
