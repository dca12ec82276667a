"""Qwen3-Next (Qwen3-Next-80B-A3B): the first of the hybrids, llama.cpp's `qwen3next` graph: Qwen3.5-MoE's blocks
(hybrid.hybrid_block: Gated DeltaNet and gated full attention, experts and a sigmoid-gated shared expert) but for
three things its files keep as HF wrote them: the v heads in HF's grouped order (v head h reads q/k head h // (LV/LK),
q and k repeated so before the delta rule), beta's and alpha's projections one matrix (`ssm_ba`: per q/k head its v
heads' b, then their a), and plain NEOX RoPE (no M-RoPE sections). HF's q, k, v and z are one matrix too
(`in_proj_qkvz`, per q/k head), which llama.cpp's converter regroups into attn_qkv and attn_gate: so does the loader."""

from . import blocks, hybrid, tables
from .hparams import gguf_moe, hf_moe

NAME = "qwen3next"
HF_ARCHITECTURES = ("Qwen3NextForCausalLM",)
ROPE_LAYOUT = "half"
FULL_ATTENTION_INTERVAL = 4

WEIGHTS = (tables.TOKEN_EMBD, tables.OUTPUT_NORM._replace(hf_add=1.0), tables.OUTPUT)
LAYER_WEIGHTS = (*tables.GATED_ATTENTION, tables.QWEN35_FFN_NORM, tables.FFN_GATE, tables.FFN_UP, tables.FFN_DOWN)
RECURRENT_WEIGHTS = (*tables.QWEN3NEXT_DELTA_NET, tables.QWEN35_FFN_NORM, tables.FFN_GATE, tables.FFN_UP,
                     tables.FFN_DOWN)
MOE_WEIGHTS = (*tables.MOE, *tables.SHARED_EXPERT)
INPUTS, STAGES, WIRING = blocks.PRE_NORM_INPUTS, hybrid.hybrid_stages(fused_ba=True), hybrid.MOE_WIRING
SHARED_EXPERT_STAGES, LLAMACPP_NAMES = hybrid.SHARED_EXPERT_STAGES, hybrid.LLAMACPP_NAMES


def block_stages(cfg, i):
    return hybrid.block_stages(STAGES, cfg, i)


def config_from_gguf(g):
    """The hybrids' fields with grouped v heads, the experts' (renormalised, in every layer, as its graph computes
    them)."""
    moe = gguf_moe(g, norm=True, every_layer=True)
    return hybrid.gguf_config(g, NAME, FULL_ATTENTION_INTERVAL, linear_v_order="grouped", **moe)


def config_from_hf(c):
    return hybrid.hf_config(c, NAME, FULL_ATTENTION_INTERVAL, linear_v_order="grouped",
                            **hf_moe(c, norm_default=True, shared=True))


def forward(w, cfg, ops, tokens, start_pos, cache, last_only=False):  # [T] -> [T or 1, V] logits
    """blocks.decoder_forward of hybrid.hybrid_block, as Qwen3.5-MoE's."""
    return blocks.decoder_forward(w, cfg, ops, tokens, start_pos, cache, last_only, hybrid.hybrid_block)
