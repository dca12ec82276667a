"""Qwen3: Qwen2 without the q/k/v biases, plus a per-head RMSNorm of q and k before RoPE (`attn_q_norm`,
`attn_k_norm`, stages `Qcur_normed`/`Kcur_normed` as llama.cpp names them), and a head_dim of its own (not D/H).
Its forward is llama's (blocks.pre_norm_forward), which norms q and k where a layer has those weights."""

from . import blocks, tables
from .hparams import gguf_config, hf_config, refuse

NAME = "qwen3"
HF_ARCHITECTURES = ("Qwen3ForCausalLM",)
ROPE_LAYOUT = "half"  # NEOX, as Qwen2

WEIGHTS = (tables.TOKEN_EMBD, tables.OUTPUT_NORM, tables.OUTPUT)
LAYER_WEIGHTS = (
    tables.ATTN_NORM, tables.ATTN_Q, tables.ATTN_K, tables.ATTN_V,
    tables.ATTN_Q_NORM, tables.ATTN_K_NORM,  # Qwen3's per-head norms
    tables.ATTN_OUTPUT, tables.FFN_NORM, tables.FFN_GATE, tables.FFN_UP, tables.FFN_DOWN,
)
INPUTS = blocks.PRE_NORM_INPUTS
STAGES = blocks.pre_norm_stages(qk_norm=True)


def config_from_gguf(g):
    return gguf_config(g, ROPE_LAYOUT)


def config_from_hf(c):
    refuse(c, "use_sliding_window", "Qwen3")
    refuse(c, "attention_bias", "Qwen3")
    return hf_config(c, NAME, ROPE_LAYOUT)


forward = blocks.pre_norm_forward
