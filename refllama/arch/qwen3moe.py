"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (per-head q/k RMSNorm before RoPE, a head_dim of its
own) with a mixture of experts for its feed-forward: softmax over the experts, top-k, renormalised (llama.cpp's
qwen3moe graph always renormalises; HF's `norm_topk_prob` says so). Its forward is llama's
(blocks.pre_norm_forward), which routes through blocks.moe_ffn where a layer has a router."""

from . import blocks, tables
from .hparams import gguf_config, gguf_moe, hf_config, hf_moe, refuse

NAME = "qwen3moe"
HF_ARCHITECTURES = ("Qwen3MoeForCausalLM",)
ROPE_LAYOUT = "half"  # NEOX, as Qwen3

WEIGHTS = (tables.TOKEN_EMBD, tables.OUTPUT_NORM, tables.OUTPUT)
LAYER_WEIGHTS = (  # a dense layer's (HF's mlp_only_layers); tables.layer_rows swaps in the experts
    tables.ATTN_NORM, tables.ATTN_Q, tables.ATTN_K, tables.ATTN_V,
    tables.ATTN_Q_NORM, tables.ATTN_K_NORM,  # Qwen3's per-head norms
    tables.ATTN_OUTPUT, tables.FFN_NORM, tables.FFN_GATE, tables.FFN_UP, tables.FFN_DOWN,
)
MOE_WEIGHTS = tables.MOE
INPUTS = blocks.PRE_NORM_INPUTS
STAGES = blocks.pre_norm_stages(qk_norm=True)


def config_from_gguf(g):
    return gguf_config(g, ROPE_LAYOUT, **gguf_moe(g, norm=True, split_ff=True))


def config_from_hf(c):
    refuse(c, "use_sliding_window", "Qwen3-MoE")
    refuse(c, "attention_bias", "Qwen3-MoE")
    return hf_config(c, NAME, ROPE_LAYOUT, **hf_moe(c, norm_default=True))


forward = blocks.pre_norm_forward
