"""The stages of the hybrids (Qwen3.5, Qwen3.5-MoE, Qwen3-Next), as llama.cpp's qwen35 graph and its delta-net base
build them: a Gated DeltaNet layer (linear attention whose state replaces the KV cache) and a gated full-attention
layer, each in Llama's pre-norm block (`hybrid_block`). Stage names are llama.cpp's `cb(...)` names, but for the two
its qwen35 graph gives other names than every other graph does: the attention residual (its `attn_residual`) is
`ffn_inp` and the norm before the feed-forward (its `attn_post_norm`) is `ffn_norm`; the full-attention output
projection (its `attn_output`, the name of the delta rule's output in a linear layer) is `attn_out`.

Linear attention, for T tokens (C = 2 LK LD + LV LD channels: q, k, v side by side):
    qkv = h W_qkv, z = h W_z, beta = sigmoid(h W_beta), g = -exp(A_log) softplus(h W_alpha + dt_bias)
    q, k, v = split(silu(conv(qkv)))        a causal depthwise conv of CK taps, its last CK - 1 inputs carried
    q, k = l2_norm(q), l2_norm(k)           each v head reads q/k head h % LK (llama.cpp's tiled order)
    S_t = exp(g_t) S_{t-1} + beta_t (v_t - exp(g_t) S_{t-1} k_t) k_t^T,  o_t = S_t q_t / sqrt(LD)
    out = (rms_norm(o) * w_norm * silu(z)) W_out
"""

from ..layers import linear
from ..trace import tap
from ..xp import array_module
from . import blocks
from .blocks import IN, Feed

LINEAR_ATTN_STAGES = ("linear_attn_qkv_mixed", "z", "beta", "beta_sigmoid", "alpha", "a_softplus", "gate",
                      "conv_output_raw", "conv_output_silu", "q_conv", "k_conv", "v_conv", "q_conv_predelta",
                      "k_conv_predelta", "attn_output", "final_output", "linear_attn_out")  # linear_attention's
GATED_ATTN_STAGES = ("Qcur_full", "Kcur", "Vcur", *blocks.QK_NORM_STAGES, *blocks.ROPE_STAGES, "kq", "kq_soft_max",
                     "attn_pregate", "gate_sigmoid", "attn_gated", "attn_out")  # gated_attention's


def hybrid_stages():  # -> every stage a hybrid block may tap, linear or full attention, in forward order
    return ("attn_norm", *LINEAR_ATTN_STAGES, *GATED_ATTN_STAGES, "ffn_inp", "ffn_norm", *blocks.DENSE_FFN_STAGES,
            "l_out")


WIRING = {  # blocks.WIRING with the two attentions' stages
    **blocks.WIRING,
    "linear_attn_qkv_mixed": Feed((("attn_norm",),), "product", "attn_qkv"),
    "z": Feed((("attn_norm",),), "product", "attn_gate"),
    "beta": Feed((("attn_norm",),), "product", "ssm_beta"),
    "beta_sigmoid": Feed((("beta",),)),
    "alpha": Feed((("attn_norm",),), "product", "ssm_alpha"),
    "a_softplus": Feed((("alpha",),)),
    "gate": Feed((("a_softplus",),)),
    "conv_output_raw": Feed((("linear_attn_qkv_mixed",),)),
    "conv_output_silu": Feed((("conv_output_raw",),)),
    "q_conv": Feed((("conv_output_silu",),)),
    "k_conv": Feed((("conv_output_silu",),)),
    "v_conv": Feed((("conv_output_silu",),)),
    "q_conv_predelta": Feed((("q_conv",),)),
    "k_conv_predelta": Feed((("k_conv",),)),
    "attn_output": Feed((("q_conv_predelta",), ("k_conv_predelta",), ("v_conv",), ("gate",), ("beta_sigmoid",))),
    "final_output": Feed((("attn_output",), ("z",)), "norm", "ssm_norm"),
    "linear_attn_out": Feed((("final_output",),), "product", "ssm_out"),
    "Qcur_full": Feed((("attn_norm",),), "product", "attn_q"),
    "Qcur_normed": Feed((("Qcur_full",),), "norm", "attn_q_norm"),
    "attn_pregate": Feed((("kq_soft_max",), ("Vcur",))),
    "gate_sigmoid": Feed((("Qcur_full",),)),
    "attn_gated": Feed((("attn_pregate",), ("gate_sigmoid",))),
    "attn_out": Feed((("attn_gated",),), "product", "attn_output"),
    "ffn_inp": Feed(((IN,), ("attn_out", "linear_attn_out")), "sum"),
}

# (llama.cpp node name, op) -> stage, for tools/dump_llamacpp.py: the graph's names where other graphs mean others
LLAMACPP_NAMES = {("attn_post_norm", "MUL"): "ffn_norm"}


def hybrid_block(x, lw, cfg, ops, i, at, last_only=False):  # [T, D] -> [T, D] ([1, D]: last_only), layer i
    """Llama's pre-norm block with linear attention or gated full attention for its attention."""
    h = tap("attn_norm", i, ops.rms_norm(x, lw["attn_norm"], cfg.rms_eps))  # [T, D]
    mixer = linear_attention if cfg.is_recurrent(i) else gated_attention
    h = mixer(h, lw, cfg, ops, i, at)  # [T, D]
    if last_only:  # only the last row goes on (the recurrent state has taken every token)
        x, h = x[-1:], h[-1:]  # [1, D]
    x = tap("ffn_inp", i, x + h)  # [T, D]
    h = tap("ffn_norm", i, ops.rms_norm(x, lw["ffn_norm"], cfg.rms_eps))  # [T, D]
    h = blocks.feed_forward(h, lw, cfg, ops, i)  # [T, D]
    return tap("l_out", i, x + h)  # [T, D]


def linear_attention(h, lw, cfg, ops, i, at):  # [T, D] -> [T, D]: Gated DeltaNet, its state carried in the cache
    xp = array_module(h)
    T, LK, LV, LD = len(h), cfg.linear_k_heads, cfg.linear_v_heads, cfg.linear_head_dim
    qkv = tap("linear_attn_qkv_mixed", i, linear(h, lw["attn_qkv"]))  # [T, C]
    z = tap("z", i, linear(h, lw["attn_gate"]))  # [T, LV*LD]
    beta = tap("beta_sigmoid", i, ops.sigmoid(tap("beta", i, linear(h, lw["ssm_beta"]))))  # [T, LV]
    alpha = tap("alpha", i, linear(h, lw["ssm_alpha"]))  # [T, LV]
    g = tap("gate", i, tap("a_softplus", i, ops.softplus(alpha + lw["ssm_dt"])) * lw["ssm_a"])  # [T, LV]: log decay
    conv_state, state = at.cache.recurrent(i, at.start_pos)  # [CK-1, C], [LV, LD, LD]
    conv, conv_state = ops.ssm_conv(qkv, conv_state, lw["ssm_conv1d"])  # [T, C]
    conv = tap("conv_output_silu", i, ops.silu(tap("conv_output_raw", i, conv)))
    q = tap("q_conv", i, conv[:, :LK * LD].reshape(T, LK, LD))
    k = tap("k_conv", i, conv[:, LK * LD:2 * LK * LD].reshape(T, LK, LD))
    v = tap("v_conv", i, conv[:, 2 * LK * LD:].reshape(T, LV, LD))
    q = tap("q_conv_predelta", i, ops.l2_norm(q, cfg.rms_eps))  # [T, LK, LD]
    k = tap("k_conv_predelta", i, ops.l2_norm(k, cfg.rms_eps))
    q, k = (xp.tile(a, (1, LV // LK, 1)) for a in (q, k))  # [T, LV, LD]: v head h reads q/k head h % LK
    o, state = ops.gated_delta_net(q, k, v, g, beta, state)  # [T, LV, LD]
    at.cache.keep(i, conv_state, state)
    o = tap("attn_output", i, o)
    o = ops.rms_norm(o, lw["ssm_norm"], cfg.rms_eps) * ops.silu(z.reshape(T, LV, LD))  # [T, LV, LD]
    o = tap("final_output", i, o.reshape(T, LV * LD))
    return tap("linear_attn_out", i, linear(o, lw["ssm_out"]))  # [T, D]


def gated_attention(h, lw, cfg, ops, i, at):  # [T, D] -> [T, D]: attention times a sigmoid gate of its own
    """q and its gate from one projection (per head: HD of q, then HD of gate), q/k RMS-normed per head, partial
    RoPE, attention, the heads' output times sigmoid(gate), the output projection."""
    T, H, HD = len(h), cfg.n_head, cfg.head_dim
    qg = tap("Qcur_full", i, linear(h, lw["attn_q"])).reshape(T, H, 2, HD)  # [T, H, 2, HD]
    q, gate = qg[:, :, 0], qg[:, :, 1].reshape(T, H * HD)
    k = tap("Kcur", i, linear(h, lw["attn_k"]).reshape(T, cfg.n_head_kv, HD))
    v = tap("Vcur", i, linear(h, lw["attn_v"]).reshape(T, cfg.n_head_kv, HD))
    q, k = blocks.qk_norm(q, k, lw, cfg, ops, i)
    q, k = blocks.rope_qk(q, k, cfg, ops, at, i)
    o = blocks.attention(q, k, v, cfg, ops, i, at, "attn_pregate")  # [T, H*HD]
    o = tap("attn_gated", i, o * tap("gate_sigmoid", i, ops.sigmoid(gate)))
    return tap("attn_out", i, linear(o, lw["attn_output"]))  # [T, D]


def block_stages(stages, cfg, i):  # -> the stages of block i: its attention's kind's, then blocks.block_stages'
    other = GATED_ATTN_STAGES if cfg.is_recurrent(i) else LINEAR_ATTN_STAGES
    return blocks.block_stages(tuple(s for s in stages if s not in other), cfg, i)
