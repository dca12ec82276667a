"""Qwen2 (Qwen2.5): llama's forward (blocks.pre_norm_forward) with q/k/v biases and llama.cpp's NEOX RoPE pairs
(i, i + R/2), so q/k rows stay in HF's order in GGUF files and at HF load alike."""

from . import blocks, tables
from .hparams import gguf_config, hf_config, refuse

NAME = "qwen2"
HF_ARCHITECTURES = ("Qwen2ForCausalLM",)
ROPE_LAYOUT = "half"  # llama.cpp's rope mode NEOX: its converter leaves q/k rows as HF has them

WEIGHTS = (tables.TOKEN_EMBD, tables.OUTPUT_NORM, tables.OUTPUT)  # output absent when tie_word_embeddings
LAYER_WEIGHTS = (
    tables.ATTN_NORM, tables.ATTN_Q, tables.ATTN_K, tables.ATTN_V,
    tables.ATTN_Q_BIAS, tables.ATTN_K_BIAS, tables.ATTN_V_BIAS,  # Qwen2's biases
    tables.ATTN_OUTPUT, tables.FFN_NORM, tables.FFN_GATE, tables.FFN_UP, tables.FFN_DOWN,
)
INPUTS, STAGES = blocks.PRE_NORM_INPUTS, blocks.pre_norm_stages()


def config_from_gguf(g):
    return gguf_config(g, ROPE_LAYOUT)


def config_from_hf(c):
    refuse(c, "use_sliding_window", "Qwen2")
    return hf_config(c, NAME, ROPE_LAYOUT)


forward = blocks.pre_norm_forward
