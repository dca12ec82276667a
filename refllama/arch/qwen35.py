"""Qwen3.5 (dense: 0.8B to 27B; Qwen3.6's dense models too): a hybrid, llama.cpp's `qwen35` graph. Three of every four
layers are linear attention (Gated DeltaNet, hybrid.linear_attention), whose conv and delta states the cache carries
in place of K/V; the fourth is full attention with a sigmoid output gate, Qwen3's per-head q/k norms and a quarter of
each head rotated (hybrid.gated_attention). Its M-RoPE sections (the same position for text in each) reduce to one
NEOX rotation. Every block is Llama's pre-norm block around them (hybrid.hybrid_block), a SwiGLU feed-forward after.

HF stores each RMSNorm weight as w for a (1 + w) weight, but the gated norm's (as llama.cpp's converter adds 1), A_log
for the decay's -exp(A_log), the conv [C, 1, CK]; where there are more v heads than k heads, the v heads grouped by k
head, which the converter reorders to llama.cpp's tiled order: refllama does the same at load (tables.tiled)."""

from . import blocks, hybrid, tables

NAME = "qwen35"
HF_ARCHITECTURES = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")
HF_MULTIMODAL = ("Qwen3_5ForConditionalGeneration",)  # released: text model read, vision left
ROPE_LAYOUT = "half"  # llama.cpp's IMROPE: NEOX pairs, one position stream for text
FULL_ATTENTION_INTERVAL = 4  # every 4th layer full attention, where a file lists no recurrent layers (llama.cpp's)

WEIGHTS = (tables.TOKEN_EMBD, tables.OUTPUT_NORM._replace(hf_add=1.0), tables.OUTPUT)
LAYER_WEIGHTS = (*tables.GATED_ATTENTION, tables.QWEN35_FFN_NORM, tables.FFN_GATE, tables.FFN_UP, tables.FFN_DOWN)
RECURRENT_WEIGHTS = (*tables.GATED_DELTA_NET, tables.QWEN35_FFN_NORM, tables.FFN_GATE, tables.FFN_UP,
                     tables.FFN_DOWN)
INPUTS, STAGES, WIRING = blocks.PRE_NORM_INPUTS, hybrid.hybrid_stages(), hybrid.WIRING
LLAMACPP_NAMES = hybrid.LLAMACPP_NAMES


def block_stages(cfg, i):
    return hybrid.block_stages(STAGES, cfg, i)


def config_from_gguf(g):
    return hybrid.gguf_config(g, NAME, FULL_ATTENTION_INTERVAL)


def config_from_hf(c):
    return hybrid.hf_config(c, NAME, FULL_ATTENTION_INTERVAL)


def forward(w, cfg, ops, tokens, start_pos, cache, last_only=False):  # [T] -> [T or 1, V] logits
    """blocks.decoder_forward of hybrid.hybrid_block: embeddings, n_layer hybrid blocks, a last norm, logits."""
    return blocks.decoder_forward(w, cfg, ops, tokens, start_pos, cache, last_only, hybrid.hybrid_block)
