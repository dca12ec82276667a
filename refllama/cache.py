"""The unified cache: per-layer K/V preallocated to the context length and filled in place, RoPE tables.

Everything here is computed or allocated once per context; a forward step only writes rows into it.
"""

import numpy as np

from .errors import RefllamaError
from .formats.safety import check_memory
from .layers import FLOAT32, yarn_dims
from .xp import to_numpy


def rope_tables(cfg, n_ctx, freq_factors=None, local=False, ops=FLOAT32):  # -> cos, sin: [n_ctx, R/2] f32
    """The model's RoPE tables in the numerics of `ops`; `local`: those of sliding-window layers where they have a
    base of their own (Gemma 3), unscaled."""
    ff = None if freq_factors is None else to_numpy(freq_factors).astype(np.float64)
    if local:
        return ops.rope_cos_sin(n_ctx, cfg.rope_dim, cfg.rope_base_swa, 1.0, cfg.rope_attn_factor, ff)
    yarn = yarn_dims(cfg) if cfg.rope_yarn else None
    return ops.rope_cos_sin(n_ctx, cfg.rope_dim, cfg.rope_base, cfg.rope_scale, cfg.rope_attn_factor, ff, yarn)


class Cache:
    """K/V for every layer, [KVH, n_ctx, HD] each, plus RoPE tables (`cos_swa`, `sin_swa` too for models whose
    sliding-window layers have a RoPE base of their own); `n_past` rows are valid. Where the numerics says so
    (`ops.kv_f16`, numerics "ggml") K and V are rounded to float16 as they are stored (llama.cpp's default cache type);
    the arrays stay float32, holding float16 values, so that the products read them without a conversion."""

    def __init__(self, cfg, n_ctx, ops=FLOAT32, xp=np, freq_factors=None):
        if n_ctx < 1:
            raise RefllamaError(f"context size must be at least 1, got {n_ctx}")
        kv = 2 * cfg.n_layer * cfg.n_head_kv * n_ctx * cfg.head_dim * 4
        n_tables = 2 if cfg.rope_base_swa else 1
        tables = n_tables * n_ctx * cfg.rope_dim // 2 * 40  # float64 angles and cos/sin on the way to float32
        check_memory(kv + tables, f"a KV cache of {n_ctx} positions", "pass a smaller context size (-c)", xp=xp)
        self.n_ctx = n_ctx
        shape = (cfg.n_head_kv, n_ctx, cfg.head_dim)
        self.k = [xp.zeros(shape, dtype=xp.float32) for _ in range(cfg.n_layer)]
        self.v = [xp.zeros(shape, dtype=xp.float32) for _ in range(cfg.n_layer)]
        self.f16 = ops.kv_f16
        cos, sin = rope_tables(cfg, n_ctx, freq_factors, ops=ops)
        self.cos, self.sin = xp.asarray(cos), xp.asarray(sin)
        if cfg.rope_base_swa:
            cos, sin = rope_tables(cfg, n_ctx, freq_factors, local=True, ops=ops)
            self.cos_swa, self.sin_swa = xp.asarray(cos), xp.asarray(sin)
        self.n_past = 0

    def reset(self):
        """Forget every cached position (the buffers are reused, not reallocated)."""
        self.n_past = 0

    def check_room(self, n_tokens):
        if self.n_past + n_tokens > self.n_ctx:
            raise RefllamaError(f"context full: {self.n_past} cached + {n_tokens} new tokens > context size "
                                f"{self.n_ctx} (raise -c/--ctx-size)")

    def store(self, layer, start_pos, k, v):  # k, v: [T, KVH, HD]; returns cached [KVH, S, HD] views
        end = start_pos + k.shape[0]
        if self.f16:
            k, v = k.astype(np.float16), v.astype(np.float16)
        self.k[layer][:, start_pos:end] = k.transpose(1, 0, 2)
        self.v[layer][:, start_pos:end] = v.transpose(1, 0, 2)
        return self.k[layer][:, :end], self.v[layer][:, :end]
