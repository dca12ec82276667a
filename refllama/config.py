"""Model hyper-parameters, read from the model file's metadata (never guessed from defaults in code)."""

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class ModelConfig:
    """Everything a forward pass needs to know about a model; `arch` names its module in refllama.arch.

    Shape letters used across refllama: T tokens in a step, D = n_embd, H = n_head,
    KVH = n_head_kv, HD = head_dim, F = n_ff, V = vocab_size, S = cached length, R = rope_dim.
    """

    arch: str
    n_layer: int
    n_embd: int  # D
    n_head: int  # H
    n_head_kv: int  # KVH
    head_dim: int  # HD
    n_ff: int  # F
    vocab_size: int  # V
    n_ctx_train: int
    rms_eps: float
    rope_base: float
    rope_dim: int  # R: leading dims of each head that rotate (== HD unless partial rotary)
    rope_layout: str  # q/k pair layout, llama.cpp's per architecture: "interleaved" (NORM) or "half" (NEOX)
    rope_scale: float = 1.0  # linear scaling: positions are divided by this
    rope_attn_factor: float = 1.0  # cos/sin multiplied by this (LongRoPE's attention factor)
    rope_ctx_orig: int | None = None  # LongRoPE: contexts beyond this take the long frequency factors
    tied_output: bool = False  # output projection reuses token_embd
    sliding_window: int | None = None  # a query sees only the last `sliding_window` keys (Mistral)


class Loaded(NamedTuple):
    """What a loader returns, GGUF file or HF directory alike."""

    config: ModelConfig
    weights: dict  # name -> array; "layers": one dict per block (refllama.arch's tables name them)
    tokenizer: object  # refllama.tokenizer.Tokenizer, or None (an HF directory without tokenizer.json)
    chat_template: str | None
    notices: list  # one-line messages for the user; `{backend}` in them stands for the backend's name
