"""Qwen3.5-MoE (Qwen3.5-35B-A3B, Qwen3.6-35B-A3B): Qwen3.5's hybrid blocks (refllama.arch.qwen35) with a mixture of
experts in every layer, llama.cpp's `qwen35moe` graph: a softmax router, the top K renormalised, and a shared expert
every token takes, times a sigmoid gate of its own (hybrid.gated_shared_expert; llama.cpp's names for its stages)."""

from . import blocks, hybrid, tables
from .hparams import gguf_moe, hf_moe

NAME = "qwen35moe"
HF_ARCHITECTURES = ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration")
HF_MULTIMODAL = ("Qwen3_5MoeForConditionalGeneration",)  # released: text model read, vision left
ROPE_LAYOUT = "half"
FULL_ATTENTION_INTERVAL = 4  # as Qwen3.5's

WEIGHTS = (tables.TOKEN_EMBD, tables.OUTPUT_NORM._replace(hf_add=1.0), tables.OUTPUT)
LAYER_WEIGHTS = (*tables.GATED_ATTENTION, tables.QWEN35_FFN_NORM, tables.FFN_GATE, tables.FFN_UP, tables.FFN_DOWN)
RECURRENT_WEIGHTS = (*tables.GATED_DELTA_NET, tables.QWEN35_FFN_NORM, tables.FFN_GATE, tables.FFN_UP,
                     tables.FFN_DOWN)
MOE_WEIGHTS = (*tables.MOE, *tables.SHARED_EXPERT)
INPUTS, STAGES, WIRING = blocks.PRE_NORM_INPUTS, hybrid.hybrid_stages(), hybrid.MOE_WIRING
SHARED_EXPERT_STAGES, LLAMACPP_NAMES = hybrid.SHARED_EXPERT_STAGES, hybrid.LLAMACPP_NAMES


def block_stages(cfg, i):
    return hybrid.block_stages(STAGES, cfg, i)


def config_from_gguf(g):
    """Qwen3.5's fields, and the experts' as llama.cpp's qwen35moe graph computes them: renormalised."""
    return hybrid.gguf_config(g, NAME, FULL_ATTENTION_INTERVAL, **gguf_moe(g, norm=True, every_layer=True))


def config_from_hf(c):
    """Qwen3.5's fields, the experts' (every layer's; always renormalised, its router says), the shared expert's."""
    moe = hf_moe(c, norm_default=True, shared=True)
    return hybrid.hf_config(c, NAME, FULL_ATTENTION_INTERVAL, **moe)


def forward(w, cfg, ops, tokens, start_pos, cache, last_only=False):  # [T] -> [T or 1, V] logits
    """qwen35's: blocks.decoder_forward of hybrid.hybrid_block, whose feed-forward is the experts' here."""
    return blocks.decoder_forward(w, cfg, ops, tokens, start_pos, cache, last_only, hybrid.hybrid_block)
