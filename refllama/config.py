"""Model hyper-parameters, read from the model file's metadata (never guessed from defaults in code)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """Everything the forward pass needs to know about a Llama-family model.

    Shape letters used across refllama: T tokens in a step, D = n_embd, H = n_head,
    KVH = n_head_kv, HD = head_dim, F = n_ff, V = vocab_size, S = cached length.
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
    rope_dim: int  # leading dims of each head that rotate (== HD for Llama)
    rope_scaling: str = "none"  # "none" | "linear" | "llama3" | "longrope" (the last two via freq factors)
    rope_scale: float = 1.0  # linear: positions are divided by this
    rope_attn_factor: float = 1.0  # cos/sin multiplied by this (LongRoPE's attention scaling)
    rope_layout: str = "interleaved"  # q/k pair layout of the weights: refllama converts HF's "half" at load
    tied_output: bool = False  # output projection reuses token_embd
    sliding_window: int | None = None  # Mistral: a query sees only the last `sliding_window` keys
