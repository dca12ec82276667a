"""Qwen2 (Qwen2.5): llama's forward with q/k/v biases and llama.cpp's NEOX RoPE pairs (i, i + R/2), so q/k
rows stay in HF's order in GGUF files and at HF load alike."""

from . import llama
from .common import Weight, gguf_config, hf_config, refuse

NAME = "qwen2"
HF_ARCHITECTURES = ("Qwen2ForCausalLM",)
ROPE_LAYOUT = "half"  # llama.cpp's rope mode NEOX: its converter leaves q/k rows as HF has them

WEIGHTS = llama.WEIGHTS[:3]  # token_embd, output_norm, output (absent when tie_word_embeddings)
LAYER_WEIGHTS = (
    Weight("attn_norm", "D", "attn_norm.weight", "input_layernorm.weight"),
    Weight("attn_q", "H*HD, D", "attn_q.weight", "self_attn.q_proj.weight"),
    Weight("attn_k", "KVH*HD, D", "attn_k.weight", "self_attn.k_proj.weight"),
    Weight("attn_v", "KVH*HD, D", "attn_v.weight", "self_attn.v_proj.weight"),
    Weight("attn_q_bias", "H*HD", "attn_q.bias", "self_attn.q_proj.bias"),
    Weight("attn_k_bias", "KVH*HD", "attn_k.bias", "self_attn.k_proj.bias"),
    Weight("attn_v_bias", "KVH*HD", "attn_v.bias", "self_attn.v_proj.bias"),
    Weight("attn_output", "D, H*HD", "attn_output.weight", "self_attn.o_proj.weight"),
    Weight("ffn_norm", "D", "ffn_norm.weight", "post_attention_layernorm.weight"),
    Weight("ffn_gate", "F, D", "ffn_gate.weight", "mlp.gate_proj.weight"),
    Weight("ffn_up", "F, D", "ffn_up.weight", "mlp.up_proj.weight"),
    Weight("ffn_down", "D, F", "ffn_down.weight", "mlp.down_proj.weight"),
)
INPUTS, STAGES = llama.INPUTS, llama.STAGES
forward = llama.forward


def config_from_gguf(g):
    return gguf_config(g, ROPE_LAYOUT)


def config_from_hf(c):
    refuse(c, "use_sliding_window", "Qwen2")
    return hf_config(c, NAME, ROPE_LAYOUT)
