"""Architectures, one module each: its weights table, its hyper-parameter reads, its RoPE pair layout as
llama.cpp assigns it, its stage names and its forward. Loaders, dump, compare and the harness read these.

    llama  (also Mistral)   NORM pairs (2i, 2i+1)    the reference forward
    qwen2                   NEOX pairs (i, i + R/2)  llama's forward, q/k/v biases
    qwen3                   NEOX                     per-head q/k RMSNorm before RoPE: its own attention block
    phi3                    NEOX                     llama's forward, fused qkv and gate/up split at load, LongRoPE
    gemma3                  NEOX                     its own forward: scaled embeddings, four norms a block, GeGLU,
                                                     local (sliding-window) and global layers
    gpt2                    no RoPE                  its own forward: learned positions, LayerNorm, biases, GELU MLP
"""

from ..errors import RefllamaError, shown
from . import gemma3, gpt2, llama, phi3, qwen2, qwen3
from .common import (
    INPUT_STAGES,
    KV_STAGES,
    LAYOUTS,
    QK_STAGES,
    TOKEN_AXIS,
    Weight,
    freq_factors,
    pair_order,
    permute_qk,
)

ARCHITECTURES = {m.NAME: m for m in (llama, qwen2, qwen3, phi3, gemma3, gpt2)}
HF_ARCHITECTURES = {hf: m for m in ARCHITECTURES.values() for hf in m.HF_ARCHITECTURES}

__all__ = ["ARCHITECTURES", "HF_ARCHITECTURES", "INPUT_STAGES", "KV_STAGES", "LAYOUTS", "QK_STAGES", "TOKEN_AXIS",
           "Weight", "for_gguf", "for_hf", "freq_factors", "get", "pair_order", "permute_qk"]


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
