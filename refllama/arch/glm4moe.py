"""GLM-4.5 and GLM-4.6 (GLM-4.5-Air, GLM-4.5, 355B-A32B): Llama's pre-norm block (blocks.pre_norm_forward) with
q/k/v biases, per-head q/k RMSNorms where the layers have them (the 355B's), RoPE on the first half of each head in
NEOX pairs, dense first layers, then DeepSeek-V3's routing (blocks.moe_ffn): each expert's sigmoid, a selection bias
that chooses but does not weigh, the K weights renormalised and scaled, and a shared expert added ungated; as
llama.cpp's src/models/glm4-moe.cpp and transformers' modeling_glm4_moe.py compute it.
A GGUF file may carry the multi-token-prediction layer after the last block (nextn_predict_layers): it is not part of
the forward and is not read."""

from . import blocks, tables
from .hparams import block_count, gguf_config, gguf_moe, hf_config, hf_deepseek_moe

NAME = "glm4moe"
HF_ARCHITECTURES = ("Glm4MoeForCausalLM",)
ROPE_LAYOUT = "half"  # NEOX

WEIGHTS = (tables.TOKEN_EMBD, tables.OUTPUT_NORM, tables.OUTPUT)
LAYER_WEIGHTS = (  # a dense lead layer's; tables.layer_rows swaps in the experts
    tables.ATTN_NORM, tables.ATTN_Q, tables.ATTN_K, tables.ATTN_V,
    *(row._replace(required=False) for row in (tables.ATTN_Q_BIAS, tables.ATTN_K_BIAS, tables.ATTN_V_BIAS,
                                               tables.ATTN_Q_NORM, tables.ATTN_K_NORM)),  # attention_bias, use_qk_norm
    tables.ATTN_OUTPUT, tables.FFN_NORM._replace(gguf="post_attention_norm.weight"),
    tables.FFN_GATE, tables.FFN_UP, tables.FFN_DOWN)
MOE_WEIGHTS = tables.DEEPSEEK_MOE
INPUTS, STAGES = blocks.PRE_NORM_INPUTS, blocks.pre_norm_stages(qk_norm=True)
SHARED_EXPERT_STAGES = blocks.UNGATED_SHARED_EXPERT_STAGES
WIRING = blocks.SHARED_EXPERT_WIRING
LLAMACPP_NAMES = {("post_attn_norm", "MUL"): "ffn_norm", ("ffn_shexp_out", "MUL_MAT"): "ffn_shexp"}


def block_stages(cfg, i):
    stages = blocks.block_stages(STAGES, cfg, i, shared=SHARED_EXPERT_STAGES)
    return stages if cfg.qk_norm else tuple(s for s in stages if s not in blocks.QK_NORM_STAGES)


def config_from_gguf(g):
    """llama.cpp's reading: sigmoid routing where the file names no gating function, the blocks before the
    nextn_predict_layers (the multi-token-prediction layers after them are not read)."""
    n_layer = block_count(g, NAME) - int(g.integer(f"{NAME}.nextn_predict_layers", 0, low=0))
    return gguf_config(g, ROPE_LAYOUT, n_layer=n_layer, qk_norm="blk.0.attn_q_norm.weight" in g.tensors,
                       **gguf_moe(g, norm=False, gating="sigmoid", deepseek=True))


def config_from_hf(c):
    """Glm4MoeForCausalLM's config.json: half of each head rotated unless partial_rotary_factor says otherwise."""
    return hf_config(c, NAME, ROPE_LAYOUT, partial_default=0.5,
                     qk_norm=c.get("use_qk_norm", False, kind=(bool,)), **hf_deepseek_moe(c))


forward = blocks.pre_norm_forward
