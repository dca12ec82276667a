"""gpt-oss (20B, 120B): Llama's pre-norm block (blocks.pre_norm_forward) with a mixture of experts in every layer, as
llama.cpp's src/models/openai-moe.cpp and transformers' modeling_gpt_oss.py compute it:
  - q, k, v and the output projection biased; one learned sink logit a head in the softmax's denominator
    (`kq_soft_max` with sinks: a row may give less than all of its weight to the keys);
  - a sliding window (128 keys in the released models) on every other layer, starting with the first;
  - NEOX RoPE with YaRN (the released config: factor 32 from 4096 positions, `truncate: false`);
  - a biased router whose K largest logits are kept and softmaxed over those K (`ffn_moe_weights_softmax`), biased
    experts (`ffn_moe_*_biased`), and the clamped SwiGLU: gate clamped above at 7, up to [-7, 7],
    gate * sigmoid(1.702 gate) * (up + 1) (`ffn_moe_swiglu_oai`).
llama.cpp names the feed-forward's norm `attn_post_norm` (refllama's ffn_norm); its alpha and limit are fixed in its
graph, and its YaRN always truncates (references.notes says so where a config differs)."""

from . import blocks, tables
from .hparams import block_count, gguf_config, gguf_moe, gguf_swa, hf_config, hf_moe, hf_swa

NAME = "gpt-oss"
HF_ARCHITECTURES = ("GptOssForCausalLM",)
ROPE_LAYOUT = "half"  # NEOX
SWA_PATTERN = 2  # every 2nd layer global: llama.cpp's load_swa_pattern(ml, 2), transformers' layer_types default
OAI_SWIGLU = (1.702, 7.0)  # (alpha, limit): llama.cpp's graph's constants, transformers' defaults

WEIGHTS = (tables.TOKEN_EMBD, tables.OUTPUT_NORM, tables.OUTPUT)
LAYER_WEIGHTS = tables.GPT_OSS_LAYER  # every layer's feed-forward is its experts (tables.layer_rows adds them)
MOE_WEIGHTS = tables.GPT_OSS_MOE
INPUTS, STAGES, MOE_STAGES = blocks.PRE_NORM_INPUTS, blocks.pre_norm_stages(), blocks.OAI_MOE_STAGES
LLAMACPP_NAMES = {("attn_post_norm", "MUL"): "ffn_norm"}  # its graph's name for the feed-forward's norm


def block_stages(cfg, i):
    return blocks.block_stages(STAGES, cfg, i, moe=MOE_STAGES)


def llamacpp_differs(cfg):  # -> why llama.cpp computes another model than this config's, or None
    if cfg.oai_swiglu == OAI_SWIGLU:
        return None
    return (f"this model's clamped SwiGLU (alpha {cfg.oai_swiglu[0]:g}, limit {cfg.oai_swiglu[1]:g}) is not "
            "llama.cpp's: its graph fixes alpha 1.702 and limit 7 (GGUF has no field for them), so llama.cpp computes "
            "another model; transformers reads swiglu_alpha and swiglu_limit (docs/references.md)")


def config_from_gguf(g):
    """llama.cpp's reading: a window on every other layer (sliding_window_pattern, if any, else period 2), every
    layer's experts routed by SOFTMAX_WEIGHT, unnormalised, its graph's SwiGLU constants."""
    window, swa = gguf_swa(g, NAME, block_count(g, NAME), SWA_PATTERN)
    return gguf_config(g, ROPE_LAYOUT, swa_layers=swa, oai_swiglu=OAI_SWIGLU,
                       **gguf_moe(g, norm=False, every_layer=True, gating="softmax_weight"))


def config_from_hf(c):
    """GptOssForCausalLM's config.json: layer_types (sliding or full), the experts' counts, swiglu_alpha and
    swiglu_limit; its rope_parameters' YaRN, `truncate` included; the released checkpoints' MXFP4-packed experts
    (quantization_config "mxfp4": tables.mxfp4_from_hf)."""
    n_layer = c.need("num_hidden_layers", int)
    window, swa = hf_swa(c, n_layer, SWA_PATTERN)
    moe = {**hf_moe(c, norm_default=False), "moe_layers": (True,) * n_layer}
    alpha, limit = (float(c.get(k, d, kind=(int, float))) for k, d in zip(("swiglu_alpha", "swiglu_limit"),
                                                                          OAI_SWIGLU, strict=True))
    return hf_config(c, NAME, ROPE_LAYOUT, sliding_window=window, swa_layers=swa, expert_gating="softmax_weight",
                     oai_swiglu=(alpha, limit), packed="mxfp4", **moe)


forward = blocks.pre_norm_forward
