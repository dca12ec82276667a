"""Phi-3: llama's forward (blocks.pre_norm_forward) on NEOX RoPE pairs, with q, k and v fused in one matrix
(`attn_qkv`), gate and up fused in another (`ffn_up`, gate rows first), both split at load, and LongRoPE: frequency
factors for short and long contexts (`rope_factors_short`/`_long`, chosen by the context size as llama.cpp does) and an
attention factor that scales cos and sin."""

from . import blocks, tables
from .hparams import gguf_config, hf_config
from .tables import Weight

NAME = "phi3"
HF_ARCHITECTURES = ("Phi3ForCausalLM",)
ROPE_LAYOUT = "half"  # NEOX

WEIGHTS = (
    tables.TOKEN_EMBD,
    tables.OUTPUT_NORM,
    tables.OUTPUT,
    Weight("rope_factors_short", "R/2", "rope_factors_short.weight", None, required=False),
    Weight("rope_factors_long", "R/2", "rope_factors_long.weight", None, required=False),
)
LAYER_WEIGHTS = (
    tables.ATTN_NORM,
    Weight("attn_qkv", "H*HD + 2*KVH*HD, D", "attn_qkv.weight", "self_attn.qkv_proj.weight",
           split=(("attn_q", "H*HD"), ("attn_k", "KVH*HD"), ("attn_v", "KVH*HD"))),
    tables.ATTN_OUTPUT,
    tables.FFN_NORM,
    Weight("ffn_gate_up", "2*F, D", "ffn_up.weight", "mlp.gate_up_proj.weight",
           split=(("ffn_gate", "F"), ("ffn_up", "F"))),
    tables.FFN_DOWN,
)
INPUTS, STAGES = blocks.PRE_NORM_INPUTS, blocks.pre_norm_stages()
forward = blocks.pre_norm_forward


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
