"""OLMo 2: a block without pre-norms. Attention reads the residual itself; its output is RMS-normed
(`attn_post_norm`) and added (`ffn_inp`); the feed-forward reads that sum, its output normed (`ffn_post_norm`) and
added (`l_out`). q and k are RMS-normed over the whole projection, every head at once, before the head split and
RoPE (NEOX pairs), as OLMoE's.

As llama.cpp's src/models/olmo2.cpp and transformers' modeling_olmo2.py compute it. OLMo 3's sliding-window layers
(an `olmo2` file with a window) are refused by name."""

from ..errors import RefllamaError
from ..trace import tap
from . import blocks, tables
from .hparams import gguf_config, hf_config, refuse
from .tables import Weight

NAME = "olmo2"
HF_ARCHITECTURES = ("Olmo2ForCausalLM",)
ROPE_LAYOUT = "half"  # NEOX: its converter leaves q/k rows as HF has them

WEIGHTS = (tables.TOKEN_EMBD, tables.OUTPUT_NORM, tables.OUTPUT)
LAYER_WEIGHTS = (
    tables.ATTN_Q,
    tables.ATTN_K,
    tables.ATTN_V,
    tables.ATTN_Q_NORM._replace(shape="H*HD"),  # over the whole projection
    tables.ATTN_K_NORM._replace(shape="KVH*HD"),
    tables.ATTN_OUTPUT,
    Weight("attn_post_norm", "D", "post_attention_norm.weight", "post_attention_layernorm.weight"),
    tables.FFN_GATE,
    tables.FFN_UP,
    tables.FFN_DOWN,
    Weight("ffn_post_norm", "D", "post_ffw_norm.weight", "post_feedforward_layernorm.weight"),
)
INPUTS = blocks.PRE_NORM_INPUTS
STAGES = (*blocks.QKV_STAGES, *blocks.QK_NORM_STAGES, *blocks.ROPE_STAGES, *blocks.ATTEND_STAGES, "attn_post_norm",
          "ffn_inp", *blocks.DENSE_FFN_STAGES, "ffn_post_norm", "l_out")


def config_from_gguf(g):
    if g.integer(f"{NAME}.attention.sliding_window", 0, low=0):
        raise RefllamaError(f"{g.path}: unsupported {NAME}.attention.sliding_window (OLMo 3's sliding-window layers)")
    return gguf_config(g, ROPE_LAYOUT)


def config_from_hf(c):
    refuse(c, "attention_bias", "OLMo 2")
    return hf_config(c, NAME, ROPE_LAYOUT)


def forward(w, cfg, ops, tokens, start_pos, cache, last_only=False):  # [T] -> [T or 1, V] logits
    """OLMo 2's forward: blocks.decoder_forward of the block below."""
    return blocks.decoder_forward(w, cfg, ops, tokens, start_pos, cache, last_only, block)


def block(x, lw, cfg, ops, i, at, last_only=False):  # [T, D] -> [T, D] ([1, D]: last_only), layer i
    q, k, v = blocks.qkv(x, lw, cfg, i)  # the residual itself: no pre-norm
    q, k = blocks.qk_norm(q, k, lw, cfg, ops, i)  # over the whole projection (the norms' weights span it)
    q, k = blocks.rope_qk(q, k, cfg, ops, at, i)
    h = blocks.attend(q, k, v, lw, cfg, ops, i, at)  # [T, D]
    del q, k, v
    if last_only:  # only the last row goes on
        x, h = x[-1:], h[-1:]  # [1, D]
    h = tap("attn_post_norm", i, ops.rms_norm(h, lw["attn_post_norm"], cfg.rms_eps))
    x = tap("ffn_inp", i, x + h)  # [T, D]

    h = blocks.gated_ffn(x, lw, ops, "swiglu", i)  # the sum itself: no pre-norm
    h = tap("ffn_post_norm", i, ops.rms_norm(h, lw["ffn_post_norm"], cfg.rms_eps))
    return tap("l_out", i, x + h)  # [T, D]
