"""OLMoE (OLMoE-1B-7B): Llama's block with RMSNorm of q and k over the whole projection (all heads at once, before
the head split: `attn_q_norm` is H*HD wide) and a mixture of experts, not renormalised. Its forward is llama's
(blocks.pre_norm_forward): qk_norm norms over the whole projection where the norm's weight spans it."""

from ..errors import RefllamaError
from . import blocks, tables
from .hparams import gguf_config, gguf_moe, hf_config, hf_moe

NAME = "olmoe"
HF_ARCHITECTURES = ("OlmoeForCausalLM",)
ROPE_LAYOUT = "half"  # NEOX

WEIGHTS = (tables.TOKEN_EMBD, tables.OUTPUT_NORM, tables.OUTPUT)
LAYER_WEIGHTS = (
    tables.ATTN_NORM, tables.ATTN_Q, tables.ATTN_K, tables.ATTN_V,
    tables.ATTN_Q_NORM._replace(shape="H*HD"), tables.ATTN_K_NORM._replace(shape="KVH*HD"),
    tables.ATTN_OUTPUT, tables.FFN_NORM,
)
MOE_WEIGHTS = tables.MOE
INPUTS = blocks.PRE_NORM_INPUTS
STAGES = blocks.pre_norm_stages(qk_norm=True)


def config_from_gguf(g):
    return gguf_config(g, ROPE_LAYOUT, **gguf_moe(g, norm=False, every_layer=True))


def config_from_hf(c):
    if c.get("clip_qkv", None, kind=(int, float)) is not None:
        raise RefllamaError(f"{c.path}: unsupported option 'clip_qkv': {c.get('clip_qkv')} (OLMoE)")
    return hf_config(c, NAME, ROPE_LAYOUT, **hf_moe(c, norm_default=False))


forward = blocks.pre_norm_forward
