"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (q/k/v biases, NEOX pairs) with a mixture of
experts not renormalised, plus a shared expert every token takes, weighted by a sigmoid gate of its own (computed as
llama.cpp's qwen2moe graph computes it: silu(x) / x). Its forward is llama's (blocks.pre_norm_forward)."""

from . import blocks, tables
from .hparams import gguf_config, gguf_moe, hf_config, hf_moe, refuse

NAME = "qwen2moe"
HF_ARCHITECTURES = ("Qwen2MoeForCausalLM",)
ROPE_LAYOUT = "half"  # NEOX, as Qwen2

WEIGHTS = (tables.TOKEN_EMBD, tables.OUTPUT_NORM, tables.OUTPUT)
LAYER_WEIGHTS = (  # a dense layer's (HF's mlp_only_layers); tables.layer_rows swaps in the experts
    tables.ATTN_NORM, tables.ATTN_Q, tables.ATTN_K, tables.ATTN_V,
    tables.ATTN_Q_BIAS, tables.ATTN_K_BIAS, tables.ATTN_V_BIAS,  # Qwen2's biases
    tables.ATTN_OUTPUT, tables.FFN_NORM, tables.FFN_GATE, tables.FFN_UP, tables.FFN_DOWN,
)
MOE_WEIGHTS = (*tables.MOE, *tables.SHARED_EXPERT)
INPUTS, STAGES = blocks.PRE_NORM_INPUTS, blocks.pre_norm_stages()
WIRING = blocks.SHARED_EXPERT_WIRING  # its shared expert's products under the dense names, ffn_out their sum


def config_from_gguf(g):
    return gguf_config(g, ROPE_LAYOUT, **gguf_moe(g, norm=False, split_ff=True, shared=1))


def config_from_hf(c):
    refuse(c, "use_sliding_window", "Qwen2-MoE")
    return hf_config(c, NAME, ROPE_LAYOUT, **hf_moe(c, norm_default=False, shared=True))


forward = blocks.pre_norm_forward
