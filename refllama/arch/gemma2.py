"""Gemma 2: Gemma 3's block (embeddings scaled by sqrt(D), (1 + w) norms before and after attention and the
feed-forward, GeGLU, local and global layers, soft-capped logits) without q/k norms, and with the attention scores
soft-capped before the softmax: cap * tanh(scores / cap) (`attn_logit_softcapping`, 50), llama.cpp's `kq_scaled_2`.

What differs from Gemma 3, as llama.cpp's src/models/gemma2.cpp and transformers' modeling_gemma2.py compute it:
  - every other layer is local (a sliding window of 4096 keys in the released models), starting with the first;
    local layers share the global layers' RoPE base and scaling;
  - the final soft-cap is always applied (30): llama.cpp's graph has no switch for it.
"""

import math

from ..errors import RefllamaError
from . import blocks, tables
from .hparams import block_count, gguf_config, gguf_swa, hf_config, hf_swa, sqrt_scale

NAME = "gemma2"
HF_ARCHITECTURES = ("Gemma2ForCausalLM",)
ROPE_LAYOUT = "half"  # NEOX, as Gemma 3
SWA_PATTERN = 2  # every 2nd layer global: llama.cpp's load_swa_pattern(ml, 2), transformers' layer_types default
WINDOW = 4096  # llama.cpp's n_swa where a file gives none
CAPS = (50.0, 30.0)  # attention and final soft-caps where a file gives none: llama.cpp's hparams defaults

WEIGHTS = (tables.TOKEN_EMBD, tables.OUTPUT_NORM._replace(hf_add=1.0), tables.OUTPUT)  # output absent: tied
LAYER_WEIGHTS = tables.GEMMA_LAYER  # every norm (1 + w): HF stores w
INPUTS = ("inp_embd", "inp_scaled")
STAGES = ("attn_norm", "Qcur", "Kcur", "Vcur", "Qcur_rope", "Kcur_rope", "kq", "kq_scaled_2", "kq_soft_max",
          "kqv_out", "attn_out", "attn_post_norm", "sa_out", "ffn_norm", "ffn_gate", "ffn_up", "ffn_geglu", "ffn_out",
          "ffn_post_norm", "l_out")
LLAMACPP_Q_SCALED = True  # llama.cpp's gemma2 graph scales q by the softmax scale before kq


def llamacpp_attn_scale(n_layer, n_embd, n_head, head_dim):
    """The softmax scale llama.cpp's gemma2 graph takes (it has no query_pre_attn_scalar): HD^-1/2, or (D/H)^-1/2 for
    the 46-layer 27B, as Gemma's reference code does."""
    return 1.0 / math.sqrt(n_embd // n_head if n_layer == 46 else head_dim)


def llamacpp_differs(cfg):  # -> why llama.cpp computes another model than this config's, or None
    theirs = llamacpp_attn_scale(cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.head_dim)
    if math.isclose(cfg.kq_scale, theirs, rel_tol=1e-6):
        return None
    return (f"this model's softmax scale (query_pre_attn_scalar^-1/2 = {cfg.kq_scale:.6g}) is not llama.cpp's "
            f"({theirs:.6g}): GGUF has no field for query_pre_attn_scalar, so llama.cpp computes another model; "
            "transformers reads it (docs/references.md)")


def config_from_gguf(g):
    """llama.cpp always has a window (4096 unless given) in every other layer and both soft-caps (50 and 30 unless
    given). It has no field for query_pre_attn_scalar: HD^-1/2, or (D/H)^-1/2 for the 46-layer 27B."""
    arch = NAME
    n_layer = block_count(g, arch)
    window, swa = gguf_swa(g, arch, n_layer, SWA_PATTERN)
    if not window:
        window, swa = WINDOW, tuple(i % SWA_PATTERN < SWA_PATTERN - 1 for i in range(n_layer))
    n_embd, n_head = int(g.integer(f"{arch}.embedding_length")), int(g.integer(f"{arch}.attention.head_count"))
    head_dim = int(g.integer(f"{arch}.attention.key_length", n_embd // n_head))
    caps = [g.real(f"{arch}.{k}_logit_softcapping", d) for k, d in zip(("attn", "final"), CAPS, strict=True)]
    return gguf_config(g, ROPE_LAYOUT, sliding_window=window, swa_layers=swa,
                       attn_scale=llamacpp_attn_scale(n_layer, n_embd, n_head, head_dim),
                       attn_softcap=caps[0], logit_softcap=caps[1], embedding_scale=sqrt_scale(n_embd))


def config_from_hf(c):
    """Gemma2ForCausalLM's config.json: the softmax scale query_pre_attn_scalar^-1/2, soft-caps where set."""
    if c.get("use_bidirectional_attention", False, kind=(bool,)):
        raise RefllamaError(f"{c.path}: unsupported option 'use_bidirectional_attention': true (Gemma 2)")
    window, swa = hf_swa(c, c.need("num_hidden_layers", int), SWA_PATTERN)
    scalar = c.get("query_pre_attn_scalar", 256, kind=(int, float))
    caps = [c.get(f"{k}_logit_softcapping", kind=(int, float)) for k in ("attn", "final")]
    return hf_config(c, NAME, ROPE_LAYOUT, act_key="hidden_activation", act="gelu_pytorch_tanh", tied_default=True,
                     sliding_window=window, swa_layers=swa, attn_scale=float(scalar) ** -0.5,
                     attn_softcap=float(caps[0]) if caps[0] else None,
                     logit_softcap=float(caps[1]) if caps[1] else None,
                     embedding_scale=sqrt_scale(c.need("hidden_size", int)))


def forward(w, cfg, ops, tokens, start_pos, cache, last_only=False):  # [T] -> [T or 1, V] logits
    """Gemma 2's forward: blocks.decoder_forward (embeddings scaled, local and global layers, logits soft-capped) of
    blocks.sandwich_block."""
    return blocks.decoder_forward(w, cfg, ops, tokens, start_pos, cache, last_only, blocks.sandwich_block)
