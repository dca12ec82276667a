"""Architectures, one module each: its weights table, its hyper-parameter reads, its RoPE pair layout as
llama.cpp assigns it, its stage names and its forward, built from the shared stages of `blocks`. No architecture
imports another. Loaders, dump, compare and the harness read these.

    llama  (also Mistral,   NORM pairs (2i, 2i+1)    blocks.pre_norm_forward, the reference forward
            Mixtral)                                 (a layer with a router: blocks.moe_ffn)
    qwen2                   NEOX pairs (i, i + R/2)  llama's forward, q/k/v biases
    qwen3                   NEOX                     llama's forward, per-head q/k RMSNorm before RoPE
    qwen2moe                NEOX                     llama's forward, q/k/v biases, experts and a shared expert
    qwen3moe                NEOX                     llama's forward, Qwen3's q/k norms, experts
    olmoe                   NEOX                     llama's forward, q/k norms over the whole projection, experts
    phi3                    NEOX                     llama's forward, fused qkv and gate/up split at load, LongRoPE
    gemma3                  NEOX                     its own forward: scaled embeddings, four norms a block, GeGLU,
                                                     local (sliding-window) and global layers
    gpt2                    no RoPE                  its own forward: learned positions, LayerNorm, biases, GELU MLP
    gemma2                  NEOX                     its own forward: Gemma 3's block without q/k norms, attention
                                                     scores soft-capped before the softmax
    smollm3                 NORM                     llama's forward, q and k unrotated in every 4th layer (NoPE)
    olmo2                   NEOX                     its own forward: no pre-norms, attention and feed-forward
                                                     outputs normed before the residual adds them, q/k norms over
                                                     the whole projection
    granite                 NORM                     llama's forward, embedding, residual, attention and logit
                                                     multipliers
    qwen35                  NEOX (M-RoPE, one        its own forward (hybrid.hybrid_block): Gated DeltaNet layers
                            position stream)         with a recurrent state, gated full-attention layers
    qwen35moe               NEOX (M-RoPE)            qwen35's forward, experts and a sigmoid-gated shared expert
    qwen3next               NEOX                     qwen35moe's forward, v heads grouped, beta and alpha fused
    gpt-oss                 NEOX (YaRN)              llama's forward: q/k/v/o biases, a sink logit a head, a window
                            (module gptoss)          on alternate layers, biased experts routed by a softmax over
                                                     the K chosen, the clamped SwiGLU
    glm4moe                 NEOX (half a head)       llama's forward: q/k/v biases, optional q/k norms, dense lead
                                                     layers, DeepSeek-V3's routing, a shared expert
    deepseek2               NORM (q_pe, k_pe)        its own forward: multi-head latent attention (expanded or
                                                     absorbed by the numerics), DeepSeek-V3's grouped sigmoid routing

The module interface (tests/test_structure.py holds every module to it):
  required  NAME                   GGUF `general.architecture`, and ModelConfig.arch
            HF_ARCHITECTURES       config.json `architectures[0]` values it reads
            ROPE_LAYOUT            "interleaved" or "half": llama.cpp's q/k pair layout for it
            WEIGHTS, LAYER_WEIGHTS tables of tables.Weight rows: the model's and each block's tensors
            INPUTS, STAGES         stage names it taps before the first block, and in each dense block, in order
            config_from_gguf(g)    ModelConfig from a refllama.formats.gguf_loader.GGUFFile
            config_from_hf(c)      (ModelConfig, rope tensors function) from an HF config.json reader
            forward(w, cfg, ops, tokens, start_pos, cache, last_only=False) -> logits [T or 1, V]
  optional  MOE_WEIGHTS            a mixture-of-experts layer's feed-forward rows (tables.layer_rows puts them in)
            HF_LAYER               a block's HF tensor prefix, if not tables.HF_LAYER (GPT-2's)
            CHAT_TEMPLATE          for GGUF files that carry none (Gemma 3)
            LLAMACPP_FUSED         llama.cpp graph nodes that fuse stages, for tools/dump_llamacpp.py
            LLAMACPP_Q_SCALED      llama.cpp scales q before kq, so its kq is refllama's times kq_scale
            LLAMACPP_NAMES         (llama.cpp node name, op) -> stage where its graph means another stage by a
                                   name (the hybrids' attn_post_norm), for tools/dump_llamacpp.py
            llamacpp_differs(cfg)  why llama.cpp computes another model than this config (compare's reference
                                   note), or None
            WIRING                 which stage feeds which, if not blocks.WIRING (Qwen2-MoE's shared expert)
            RECURRENT_WEIGHTS      a linear-attention layer's rows (ModelConfig.is_recurrent), in place of LAYER_WEIGHTS
            block_stages(cfg, i)   the stages block i taps, if not blocks.block_stages of STAGES (the hybrids')
            SHARED_EXPERT_STAGES   its shared expert's stages, if not Qwen2-MoE's (Qwen3.5-MoE's sigmoid gate)
            MOE_STAGES             its mixture of experts' stages, if not blocks.MOE_STAGES (gpt-oss's)
            EXPANDED_STAGES,       latent attention's stages of one form alone: the paper's (numerics float32)
            ABSORBED_STAGES        and llama.cpp's (numerics ggml; DeepSeek's, docs/mla.md)
            HF_MULTIMODAL          HF_ARCHITECTURES that are a multimodal checkpoint: the text model's config is its
                                   `text_config`, its tensors under `model.language_model.` (Qwen3.5's released ones)
  defaults  SWA_PATTERN, WINDOW    a family's sliding-window period and window where a file gives none
            LOCAL_ROPE_BASE, CAPS  Gemma's local RoPE base, Gemma 2's soft-caps, where a file gives none
            NOPE_INTERVAL          SmolLM3's NoPE period (llama.cpp's, fixed)
            FULL_ATTENTION_INTERVAL  the hybrids' full-attention period where a file lists no recurrent layers
            OAI_SWIGLU             gpt-oss's clamped SwiGLU (alpha, limit) where a file gives none (llama.cpp's)
            LATENT_EPS             transformers' epsilon of DeepSeek's latent norms (HF directories)
"""

from functools import cache

from ..errors import RefllamaError, shown
from ..pairs import LAYOUTS, QK_STAGES, pair_order, permute_qk
from . import (
    blocks,
    deepseek2,
    gemma2,
    gemma3,
    glm4moe,
    gpt2,
    gptoss,
    granite,
    llama,
    olmo2,
    olmoe,
    phi3,
    qwen2,
    qwen2moe,
    qwen3,
    qwen3moe,
    qwen3next,
    qwen35,
    qwen35moe,
    smollm3,
)
from .blocks import IN, block_input, block_stages, moe_stage_order
from .hparams import freq_factors
from .tables import Weight

REQUIRED = ("NAME", "HF_ARCHITECTURES", "ROPE_LAYOUT", "WEIGHTS", "LAYER_WEIGHTS", "INPUTS", "STAGES",
            "config_from_gguf", "config_from_hf", "forward")
OPTIONAL = ("MOE_WEIGHTS", "HF_LAYER", "CHAT_TEMPLATE", "LLAMACPP_FUSED", "LLAMACPP_Q_SCALED", "llamacpp_differs",
            "WIRING", "RECURRENT_WEIGHTS", "block_stages", "LLAMACPP_NAMES", "SHARED_EXPERT_STAGES", "HF_MULTIMODAL",
            "MOE_STAGES", "EXPANDED_STAGES", "ABSORBED_STAGES")

ARCHITECTURES = {m.NAME: m for m in (llama, qwen2, qwen3, phi3, gemma3, gpt2, qwen2moe, qwen3moe, olmoe, gemma2,
                                     smollm3, olmo2, granite, qwen35, qwen35moe, qwen3next, gptoss, glm4moe, deepseek2)}
HF_ARCHITECTURES = {hf: m for m in ARCHITECTURES.values() for hf in m.HF_ARCHITECTURES}

__all__ = ["ARCHITECTURES", "HF_ARCHITECTURES", "LAYOUTS", "OPTIONAL", "QK_STAGES", "REQUIRED", "Weight", "for_gguf",
           "for_hf", "freq_factors", "get", "layer_stages", "pair_order", "permute_qk", "stage_order", "wiring",
           "feeds"]


def layer_stages(arch, cfg):  # -> one tuple of stage names per block
    """The stages each block of this model taps, in order: a function of the config, since a layer with a router
    taps the mixture of experts' stages where a dense one taps its feed-forward's."""
    stages = getattr(arch, "block_stages", lambda cfg, i: block_stages(arch.STAGES, cfg, i))
    return [stages(cfg, i) for i in range(cfg.n_layer)]


def stage_order(arch):
    """Every stage a block of the family may tap, dense or mixture of experts, in forward order."""
    shared = getattr(arch, "SHARED_EXPERT_STAGES", blocks.SHARED_EXPERT_STAGES)
    moe = getattr(arch, "MOE_STAGES", blocks.MOE_STAGES)
    return moe_stage_order(arch.STAGES, shared, moe) if hasattr(arch, "MOE_WEIGHTS") else arch.STAGES


@cache
def wiring(arch):  # -> {stage: blocks.Feed}: which of the family's stages feeds which, each read the one it taps
    return blocks.wiring(getattr(arch, "WIRING", blocks.WIRING), stage_order(arch), arch.INPUTS)


def feeds(arch, stage, layer):  # -> the names of the records `stage` of block `layer` reads (None: not a block's)
    feed = wiring(arch).get(stage)
    if feed is None or layer is None:
        return None
    return [block_input(arch.INPUTS, layer) if r == IN else f"{r}-{layer}" for r in feed.reads]


def get(name):
    """The module of architecture `name` (a ModelConfig's `arch`)."""
    return ARCHITECTURES[name]


def for_gguf(name, path):
    """The module for a GGUF file's `general.architecture`, or an error listing the supported ones."""
    if name not in ARCHITECTURES:
        raise RefllamaError(f"{path}: unsupported general.architecture {shown(name)} "
                            f"(supported: {', '.join(ARCHITECTURES)})")
    return ARCHITECTURES[name]


def for_hf(name, path):
    """The module for an HF config's `architectures[0]`, or an error listing the supported ones."""
    if not isinstance(name, str) or name not in HF_ARCHITECTURES:
        raise RefllamaError(f"{path}: unsupported architectures {shown(name)} "
                            f"(supported: {', '.join(HF_ARCHITECTURES)})")
    return HF_ARCHITECTURES[name]
