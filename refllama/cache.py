"""The unified cache: per-layer K/V preallocated to the context length and filled in place, a linear-attention layer's
recurrent state in its place, RoPE tables.

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
    return ops.rope_cos_sin(n_ctx, cfg.rope_dim, cfg.rope_base, cfg.rope_scale, cfg.rope_attn_factor, ff, yarn,
                            mscale_in_kq=cfg.rope_mscale_in_kq)


def kv_shape(cfg, ops=FLOAT32):  # -> (heads, k width, v width): one layer's cached K and V a position
    """What an attention layer caches: KVH heads of HD for K and V; with latent attention (cfg.kv_lora_rank) the
    paper's H heads of k (HD) and v (v_head_dim) as the float32 forward expands them, or, as llama.cpp caches it
    (`ops.mla_absorbed`), one head of the latent and the rotated k_pe, whose first KL columns V reads (v width
    None: no V of its own)."""
    if not cfg.kv_lora_rank:
        return cfg.n_head_kv, cfg.head_dim, cfg.head_dim
    if ops.mla_absorbed:
        return 1, cfg.kv_lora_rank + cfg.rope_dim, None
    return cfg.n_head, cfg.head_dim, cfg.v_head_dim


class Cache:
    """K/V for every layer, [KVH, n_ctx, HD] each (latent attention's: kv_shape), plus RoPE tables (`cos_swa`,
    `sin_swa` too for models whose sliding-window layers have a RoPE base of their own); `n_past` rows are valid.
    Where the numerics says so (`ops.kv_f16`, numerics "ggml") K and V are rounded to float16 as they are stored
    (llama.cpp's default cache type); the arrays stay float32, holding float16 values, so that the products read them
    without a conversion.

    A linear-attention layer (ModelConfig.is_recurrent) keeps no K/V: its state is the last CK - 1 inputs of its
    conv [CK-1, C] and its delta state [LV, LD, LD] (llama.cpp's [v head, dv, dk]), both float32, both as of the
    n_past positions; a step from position 0 starts from zeros."""

    def __init__(self, cfg, n_ctx, ops=FLOAT32, xp=np, freq_factors=None):
        if n_ctx < 1:
            raise RefllamaError(f"context size must be at least 1, got {n_ctx}")
        attention = [i for i in range(cfg.n_layer) if not cfg.is_recurrent(i)]
        recurrent = [i for i in range(cfg.n_layer) if cfg.is_recurrent(i)]
        LV, LD, K = cfg.linear_v_heads, cfg.linear_head_dim, cfg.conv_kernel
        C = (2 * cfg.linear_k_heads + LV) * LD  # the conv's channels: q, k and v
        heads, k_width, v_width = kv_shape(cfg, ops)
        kv = len(attention) * heads * n_ctx * (k_width + (v_width or 0)) * 4 + len(recurrent) * (
            (K - 1) * C + LV * LD * LD) * 4
        n_tables = 2 if cfg.rope_base_swa else 1
        tables = n_tables * n_ctx * cfg.rope_dim // 2 * 40  # float64 angles and cos/sin on the way to float32
        check_memory(kv + tables, f"a KV cache of {n_ctx} positions", "pass a smaller context size (-c)", xp=xp)
        self.n_ctx = n_ctx
        self.k = [xp.zeros((heads, n_ctx, k_width), xp.float32) if i in attention else None for i in range(cfg.n_layer)]
        self.v = [xp.zeros((heads, n_ctx, v_width), xp.float32) if i in attention and v_width else None
                  for i in range(cfg.n_layer)]
        self.v_width = cfg.kv_lora_rank  # where V is K's first columns (llama.cpp's latent cache)
        self.conv = [xp.zeros((K - 1, C), xp.float32) if i in recurrent else None for i in range(cfg.n_layer)]
        self.delta = [xp.zeros((LV, LD, LD), xp.float32) if i in recurrent else None for i in range(cfg.n_layer)]
        self.f16 = ops.kv_f16
        cos, sin = rope_tables(cfg, n_ctx, freq_factors, ops=ops)
        self.cos, self.sin = xp.asarray(cos), xp.asarray(sin)
        if cfg.rope_base_swa:
            cos, sin = rope_tables(cfg, n_ctx, freq_factors, local=True, ops=ops)
            self.cos_swa, self.sin_swa = xp.asarray(cos), xp.asarray(sin)
        self.n_past = 0

    @property
    def nbytes(self):  # what the K/V (or latent) and recurrent states take
        return sum(a.nbytes for a in (*self.k, *self.v, *self.conv, *self.delta) if a is not None)

    def reset(self):
        """Forget every cached position (the buffers are reused, not reallocated)."""
        self.n_past = 0

    def check_room(self, n_tokens):
        if self.n_past + n_tokens > self.n_ctx:
            raise RefllamaError(f"context full: {self.n_past} cached + {n_tokens} new tokens > context size "
                                f"{self.n_ctx} (raise -c/--ctx-size)")

    def store(self, layer, start_pos, k, v):  # k, v: [T, KVH, HD]; returns cached [KVH, S, HD] views
        """v None: the layer caches no V of its own, it reads K's first columns (a latent's)."""
        end = start_pos + k.shape[0]
        self.k[layer][:, start_pos:end] = (k.astype(np.float16) if self.f16 else k).transpose(1, 0, 2)
        if v is None:
            return self.k[layer][:, :end], self.k[layer][:, :end, :self.v_width]
        self.v[layer][:, start_pos:end] = (v.astype(np.float16) if self.f16 else v).transpose(1, 0, 2)
        return self.k[layer][:, :end], self.v[layer][:, :end]

    def recurrent(self, layer, start_pos):  # -> conv state [CK-1, C], delta state [LV, LD, LD] before start_pos
        if start_pos == 0:
            return self.conv[layer] * 0, self.delta[layer] * 0
        return self.conv[layer], self.delta[layer]

    def keep(self, layer, conv, delta):  # a linear-attention layer's state after its step
        self.conv[layer], self.delta[layer] = conv, delta
