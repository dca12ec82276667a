"""The layers of a Llama-family transformer, each a pure function of arrays.

Shape letters: T tokens, D model dim, H / KVH query / kv heads, HD head dim, F ffn dim, V vocab,
S cached length (keys visible to the step). Activations are float32. Each function takes its array
module from its inputs, so the same code runs on NumPy and CuPy.
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .xp import array_module


def embedding(tokens, w_embd):  # [T] int, [V, D] -> [T, D]
    return w_embd[tokens]


def rms_norm(x, w, eps):  # [..., D], [D] -> [..., D]: each row normed over its last axis
    xp = array_module(x)
    # llama.cpp and transformers both normalise in float32, multiplying by 1/sqrt(mean(x^2) + eps), then by w;
    # the float32 squares are added one by one in float64 as ggml adds them (cumsum is sequential; transformers
    # sums in float32: a difference in the last bit)
    total = xp.square(x).astype(xp.float64).cumsum(axis=-1)[..., -1:]  # [..., 1]
    mean_sq = (total / x.shape[-1]).astype(xp.float32)
    return x * (1.0 / xp.sqrt(mean_sq + xp.float32(eps))) * w


def linear(x, w, b=None):  # [T, in], [out, in], [out] -> [T, out]
    return x @ w.T if b is None else x @ w.T + b


def mul_mat_id(x, mats, ids, product=linear):  # [T, K, in] or [T, in], E matrices [out, in], [T, K] ids -> [T, K, out]
    """Each slot's row times its expert's matrix, as ggml's mul_mat_id: the rows of one expert gathered and
    multiplied together (`product(rows, matrix)`), so each chosen expert's matrix is read once a step and the others
    not at all. x [T, in]: every slot of a token reads its token's row (the gate and up products)."""
    xp = array_module(x)
    T, K = ids.shape
    if x.ndim == 2:
        x = xp.broadcast_to(x[:, None], (T, K, x.shape[-1]))  # [T, K, in]
    flat, rows = ids.reshape(-1), x.reshape(T * K, -1)  # [T*K], [T*K, in]
    out = xp.empty((T * K, mats[0].shape[0]), xp.float32)
    for e in map(int, xp.unique(flat)):
        at = xp.nonzero(flat == e)[0]
        out[at] = product(rows[at], mats[e])
    return out.reshape(T, K, -1)


def rope_interleaved(x, cos, sin):  # [T, n, HD], [T, R/2], [T, R/2] -> [T, n, HD]
    """Rotate pairs (x[2i], x[2i+1]) by angle pos*theta_i: GGUF llama weights, llama.cpp's rope mode 0.

    Each pair is the complex number x[2i] + i x[2i+1], so the rotation is one complex product with
    cos + i sin (as Meta's reference code writes it). Only the first R = 2 * cos.shape[-1] dims of each
    head rotate; the rest pass through.
    """
    xp = array_module(x)
    r = 2 * cos.shape[-1]
    rot = xp.empty(cos.shape, dtype=xp.complex64)  # [T, R/2]
    rot.real, rot.imag = cos, sin
    pairs = xp.ascontiguousarray(x[..., :r], dtype=xp.float32).view(xp.complex64)  # [T, n, R/2]
    rotated = (pairs * rot[:, None, :]).view(xp.float32)  # [T, n, R]
    return rotated if r == x.shape[-1] else xp.concatenate([rotated, x[..., r:]], axis=-1)


def rope_half(x, cos, sin):  # [T, n, HD], [T, R/2], [T, R/2] -> [T, n, HD]
    """Rotate pairs (x[i], x[i + R/2]): HF weights, transformers' rotate_half / apply_rotary_pos_emb."""
    xp = array_module(x)
    half = cos.shape[-1]
    x0, x1 = x[..., :half], x[..., half:2 * half]  # [T, n, R/2] each
    c, s = cos[:, None, :], sin[:, None, :]
    out = xp.empty_like(x)
    out[..., :half] = x0 * c - x1 * s
    out[..., half:2 * half] = x0 * s + x1 * c
    out[..., 2 * half:] = x[..., 2 * half:]
    return out


ROPE = {"interleaved": rope_interleaved, "half": rope_half}  # by q/k pair layout: llama.cpp's NORM and NEOX modes


def rope_cos_sin(n_ctx, rope_dim, base, scale=1.0, attn_factor=1.0, freq_factors=None, yarn=None,
                 mscale_in_kq=False):  # -> cos, sin
    """cos/sin [n_ctx, R/2] of pos * theta_i, theta_i = base^(-2i/R) divided by the model's frequency factors (Llama
    3.1's `rope_freqs`, LongRoPE's), positions divided by `scale` (linear scaling), both times `attn_factor`
    (LongRoPE's attention factor): computed in float64 once, stored float32. `yarn` (low, high): YaRN blends each
    theta_i between itself (i <= low) and theta_i / scale (i >= high), linearly between, and multiplies cos and sin
    by yarn_mscale(scale) too, unless `mscale_in_kq` (DeepSeek's: in the softmax scale instead)."""
    theta = base ** (-np.arange(rope_dim // 2, dtype=np.float64) * 2.0 / rope_dim)  # [R/2]
    if freq_factors is not None:
        theta = theta / freq_factors
    if yarn is not None:
        ramp = yarn_ramp(rope_dim // 2, *yarn, np.float64)  # [R/2]: 1 extrapolates (unscaled), 0 interpolates
        mscale = 1.0 if mscale_in_kq else yarn_mscale(scale)
        theta, scale, attn_factor = theta / scale * (1 - ramp) + theta * ramp, 1.0, attn_factor * mscale
    angle = (np.arange(n_ctx, dtype=np.float64) / scale)[:, None] * theta[None, :]  # [n_ctx, R/2]
    return (attn_factor * np.cos(angle)).astype(np.float32), (attn_factor * np.sin(angle)).astype(np.float32)


def yarn_mscale(scale, mscale=1.0):  # YaRN's factor on cos and sin: 1 + 0.1 mscale ln(scale) (transformers' get_mscale)
    return 1.0 + 0.1 * mscale * math.log(scale) if scale > 1 else 1.0


YARN_BETAS = (32.0, 1.0)  # beta_fast, beta_slow: the YaRN paper's, transformers' and llama.cpp's defaults


def yarn_dims(cfg):  # -> (low, high): where YaRN's ramp starts and ends, from a config's rope_yarn
    """The dim whose wavelength turns beta times in the original context (ggml_rope_yarn_corr_dims, transformers'
    find_correction_range), floored and ceiled unless the config turns truncation off (transformers' option; llama.cpp
    always truncates)."""
    beta_fast, beta_slow, truncate = cfg.rope_yarn

    def dim(turns):
        return cfg.rope_dim * math.log(cfg.rope_ctx_orig / (turns * 2 * math.pi)) / (2 * math.log(cfg.rope_base))
    low, high = dim(beta_fast), dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return float(max(low, 0)), float(min(high, cfg.rope_dim - 1))


def yarn_ramp(n, low, high, dtype):  # -> [n]: 1 - clamp((i - low) / (high - low), 0, 1), as ggml's rope_yarn_ramp
    y = (np.arange(n, dtype=dtype) - dtype(low)) / max(dtype(0.001), dtype(high) - dtype(low))
    return dtype(1) - np.minimum(dtype(1), np.maximum(dtype(0), y))


def causal_mask(start_pos, T, S, xp, window=None):  # -> [T, S] additive: 0 where visible, -inf elsewhere
    """Query i (position start_pos + i) sees keys j <= its position; with a sliding `window`, only the
    last `window` of them (j > position - window), as Mistral's attention does."""
    q_pos = start_pos + xp.arange(T)[:, None]
    k_pos = xp.arange(S)[None, :]
    visible = k_pos <= q_pos
    if window is not None and window < S:  # a window as long as the keys hides none of them
        visible &= k_pos > q_pos - window
    return xp.where(visible, 0.0, -xp.inf).astype(xp.float32)


def softmax(x):  # [..., n] -> [..., n]
    xp = array_module(x)
    e = xp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attention_scores(q, k):  # [T, H, HD], [KVH, S, HD] -> [H, T, S] unscaled q.k
    """Grouped-query scores: query head h reads kv head h // (H / KVH), as llama.cpp and transformers do.

    K is broadcast over the G = H / KVH query heads of its group, never copied per head.
    """
    T, H, HD = q.shape
    KVH, S, _ = k.shape
    q = q.transpose(1, 0, 2).reshape(KVH, H // KVH, T, HD)  # [KVH, G, T, HD]
    return (q @ k[:, None].transpose(0, 1, 3, 2)).reshape(H, T, S)  # [KVH, G, T, S] -> [H, T, S]


def attention_weights(kq, mask, scale, sinks=None):  # [H, T, S], [T, S], [H] -> [H, T, S], rows sum to 1
    """softmax(scale * q.k + mask); scale is 1/sqrt(HD) but for Gemma 3 (ModelConfig.kq_scale). `sinks`: one
    learned logit a head (gpt-oss's attention sinks) in each row's denominator as a key no value belongs to, so a
    row may sum to less than 1."""
    x = kq * scale + mask
    return softmax(x) if sinks is None else sink_softmax(x, sinks)


def sink_softmax(x, sinks):  # [H, T, S], [H] -> [H, T, S]: softmax with head h's sink logit in each denominator
    """exp(x_j - m) / (sum_k exp(x_k - m) + exp(sink_h - m)), m the larger of the row's max and the sink: as if the
    sink were one more key, its weight dropped (gpt-oss's attention sinks). In the dtype of x."""
    xp = array_module(x)
    sink = sinks.astype(x.dtype)[:, None, None]  # [H, 1, 1]
    top = xp.maximum(x.max(axis=-1, keepdims=True), sink)
    e = xp.exp(x - top)
    return e / (e.sum(axis=-1, keepdims=True) + xp.exp(sink - top))


def attention_mix(p, v):  # [H, T, S], [KVH, S, HD] -> [T, H*HD], the heads side by side
    """Each head's values weighted by its softmax row."""
    H, T, S = p.shape
    KVH, _, HD = v.shape
    out = p.reshape(KVH, H // KVH, T, S) @ v[:, None]  # [KVH, G, T, HD], V broadcast like K
    return out.reshape(H, T, HD).transpose(1, 0, 2).reshape(T, H * HD)


def silu(x):  # [...] -> [...]
    """x * sigmoid(x), with sigmoid written through tanh so large |x| cannot overflow."""
    xp = array_module(x)
    return x * (0.5 + 0.5 * xp.tanh(0.5 * x))


def swiglu(gate, up):  # [T, F], [T, F] -> [T, F]: the gated unit of the feed-forward block
    return silu(gate) * up


def swiglu_oai(gate, up, alpha, limit):  # [..., F], [..., F] -> [..., F]: gpt-oss's clamped SwiGLU
    """gate clamped above at `limit`, up to [-limit, limit]; gate * sigmoid(alpha gate) * (up + 1) (OpenAI's
    reference and transformers' GptOssExperts)."""
    xp = array_module(gate)
    x = xp.minimum(gate, xp.float32(limit))
    y = xp.clip(up, xp.float32(-limit), xp.float32(limit))
    return x * sigmoid(xp.float32(alpha) * x) * (y + xp.float32(1))


def gelu_tanh(x):  # [...] -> [...]
    """GELU in its tanh approximation (transformers' gelu_pytorch_tanh, GPT-2's and Gemma's).

    llama.cpp's CPU backend differs here: it rounds x to float16 and reads a 65536-entry table of float16 GELU
    values (ggml-cpu/vec.h, GGML_GELU_FP16), so its GELU carries float16 rounding, a relative error up to ~1e-3.
    refllama computes it in float32, as transformers does, or as llama.cpp does in numerics "ggml"."""
    xp = array_module(x)
    c = xp.float32(0.7978845608028654)  # sqrt(2 / pi)
    return 0.5 * x * (1.0 + xp.tanh(c * (x + xp.float32(0.044715) * x * x * x)))


def geglu(gate, up):  # [T, F], [T, F] -> [T, F]: Gemma's gated unit, GELU where SwiGLU has SiLU
    return gelu_tanh(gate) * up


def l2_norm(x, eps):  # [..., d] -> [..., d]: each vector over its own length (Gated DeltaNet's q and k)
    xp = array_module(x)
    return x * (1.0 / xp.sqrt(xp.square(x).sum(axis=-1, keepdims=True) + xp.float32(eps)))


def causal_conv(x, state, w):  # [T, C], [K-1, C], [C, K] -> y [T, C], state [K-1, C]
    """Each channel's kernel over its last K inputs, the K - 1 before the first carried in `state` (zeros at the
    start of a sequence) and handed on: y_t = sum_j w[:, j] x_{t - (K-1) + j} (Gated DeltaNet's short conv)."""
    xp = array_module(x)
    K, T = w.shape[1], len(x)
    xs = xp.concatenate([state, x], axis=0)  # [K-1+T, C]
    y = xs[0:T] * w[:, 0]
    for j in range(1, K):
        y = y + xs[j:j + T] * w[:, j]
    return y, xs[T:]


def gated_delta_rule(q, k, v, g, beta, state):  # [T, H, dk], [T, H, dk], [T, H, dv], [T, H], [T, H], [H, dv, dk]
    """-> out [T, H, dv], state [H, dv, dk] (llama.cpp's layout; HF's is [H, dk, dv]): the gated delta rule a token at
    a time, q and k normed, one q/k head per v head. The state S decays by exp(g), recalls S k for the key, moves
    that recall towards v by beta (delta = beta (v - S k), S += delta k^T) and is read by q: out = S q / sqrt(dk)."""
    xp = array_module(q)
    q = q * xp.float32(q.shape[-1] ** -0.5)
    out = xp.empty_like(v)
    for t in range(len(q)):
        state = state * xp.exp(g[t])[:, None, None]
        recall = xp.einsum("hvk,hk->hv", state, k[t])  # [H, dv]: what the state holds for k
        delta = (v[t] - recall) * beta[t][:, None]
        state = state + delta[:, :, None] * k[t][:, None, :]
        out[t] = xp.einsum("hvk,hk->hv", state, q[t])
    return out, state


def sigmoid(x):  # [...] -> [...], through tanh so that large |x| cannot overflow
    xp = array_module(x)
    return 0.5 + 0.5 * xp.tanh(0.5 * x)


def softplus(x):  # [...] -> [...]: log(1 + e^x), x itself past 20 (torch's threshold and ggml's)
    xp = array_module(x)
    return xp.where(x > 20, x, xp.log1p(xp.exp(xp.minimum(x, 20))))


def layer_norm(x, w, b, eps):  # [T, D], [D], [D] -> [T, D]: GPT-2's norm, mean removed, then scaled and shifted
    xp = array_module(x)
    mean = x.sum(axis=-1, keepdims=True) / x.shape[-1]  # [T, 1]
    centered = x - mean
    var = xp.square(centered).sum(axis=-1, keepdims=True) / x.shape[-1]  # [T, 1]
    return centered * (1.0 / xp.sqrt(var + eps)) * w + b


def softcap(x, cap):  # [...] -> [...] in (-cap, cap): Gemma's final_logit_softcapping
    xp = array_module(x)
    return cap * xp.tanh(x / cap)


class Ops(NamedTuple):
    """The steps whose arithmetic a numerics chooses, as one table: refllama.numerics picks one at load from
    (backend, numerics), and every forward calls its steps through it (`ops.rms_norm(...)`), so none is forgotten.
    FLOAT32, below, is this module's own functions; each other table computes the same steps, in llama.cpp's
    arithmetic (numerics "ggml") or as Numba kernels, on the same shapes."""

    rms_norm: Callable  # (x [..., D], w [D], eps) -> [..., D]
    rope: dict  # q/k pair layout ("interleaved", "half") -> (x [T, n, HD], cos, sin [T, R/2]) -> [T, n, HD]
    rope_cos_sin: Callable  # (n_ctx, R, base, scale, attn_factor, freq_factors [R/2] | None, yarn) -> cos, sin
    attention_scores: Callable  # (q [T, H, HD], k [KVH, S, HD]) -> [H, T, S]
    attention_weights: Callable  # (kq [H, T, S], mask [T, S], scale, sinks [H] | None) -> [H, T, S]
    attention_mix: Callable  # (p [H, T, S], v [KVH, S, HD]) -> [T, H*HD]
    swiglu: Callable  # (gate [T, F], up [T, F]) -> [T, F]
    gelu: Callable  # [...] -> [...]
    geglu: Callable  # (gate [T, F], up [T, F]) -> [T, F]
    softcap: Callable  # (x [...], cap) -> [...] in (-cap, cap)
    kv_f16: bool  # K and V rounded to float16 as the cache stores them (llama.cpp's default cache type)
    q_first: bool  # q scaled by kq_scale before q.k where llama.cpp's graph does so (arch LLAMACPP_Q_SCALED)
    softmax: Callable = softmax  # [T, n] -> [T, n]: a softmax without mask or scale (a router's, over its experts)
    silu: Callable = silu  # [...] -> [...] (Qwen2-MoE's shared-expert gate)
    mul_mat_id: Callable = mul_mat_id  # (x [T, K, in] or [T, in], E matrices, ids [T, K]) -> [T, K, out]
    layer_norm: Callable = layer_norm  # (x [T, D], w [D], b [D], eps) -> [T, D] (GPT-2's norm)
    sigmoid: Callable = sigmoid  # [...] -> [...] (Qwen3.5's gates and beta)
    softplus: Callable = softplus  # [...] -> [...] (Gated DeltaNet's decay)
    l2_norm: Callable = l2_norm  # (x [..., d], eps) -> [..., d] (its q and k)
    ssm_conv: Callable = causal_conv  # (x [T, C], state [CK-1, C], w [C, CK]) -> y [T, C], state
    swiglu_oai: Callable = swiglu_oai  # (gate, up [..., F], alpha, limit) -> [..., F] (gpt-oss's experts)
    gated_delta_net: Callable = gated_delta_rule  # (q, k [T, H, dk], v [T, H, dv], g, beta [T, H], state [H, dv, dk])
    # -> out [T, H, dv], state
    mla_absorbed: bool = False  # latent attention as llama.cpp computes it: the k/v expansion absorbed into q and the
    # output, the latent cached (numerics "ggml"); else as the paper writes it, k and v expanded and cached


FLOAT32 = Ops(rms_norm=rms_norm, rope=ROPE, rope_cos_sin=rope_cos_sin, attention_scores=attention_scores,
              attention_weights=attention_weights, attention_mix=attention_mix, swiglu=swiglu, gelu=gelu_tanh,
              geglu=geglu, softcap=softcap, kv_f16=False, q_first=False)
