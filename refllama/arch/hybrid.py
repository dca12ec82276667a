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

from ..errors import RefllamaError
from ..formats.ggml_types import GGUFValueType
from ..layers import linear
from ..trace import tap
from ..xp import array_module
from . import blocks, hparams
from .blocks import IN, Feed

LINEAR_ATTN_STAGES = ("linear_attn_qkv_mixed", "z", "linear_attn_mixed_ba", "b", "a", "beta", "alpha", "beta_sigmoid",
                      "a_softplus", "gate",
                      "conv_output_raw", "conv_output_silu", "q_conv", "k_conv", "v_conv", "q_conv_predelta",
                      "k_conv_predelta", "attn_output", "final_output", "linear_attn_out")  # linear_attention's
GATED_ATTN_STAGES = ("Qcur_full", "Kcur", "Vcur", *blocks.QK_NORM_STAGES, *blocks.ROPE_STAGES, "kq", "kq_soft_max",
                     "attn_pregate", "gate_sigmoid", "attn_gated", "attn_out")  # gated_attention's


def hybrid_stages(fused_ba=False):  # -> every stage a hybrid block may tap, linear or full attention, in order
    """`fused_ba`: beta's and alpha's projections one matrix (Qwen3-Next's), its views `b` and `a`."""
    apart = ("linear_attn_mixed_ba", "b", "a") if not fused_ba else ("beta", "alpha", "beta_sigmoid")
    return ("attn_norm", *(s for s in LINEAR_ATTN_STAGES if s not in apart), *GATED_ATTN_STAGES, "ffn_inp",
            "ffn_norm", *blocks.DENSE_FFN_STAGES, "l_out")


WIRING = {  # blocks.WIRING with the two attentions' stages
    **blocks.WIRING,
    "linear_attn_qkv_mixed": Feed((("attn_norm",),), "product", "attn_qkv"),
    "z": Feed((("attn_norm",),), "product", "attn_gate"),
    "beta": Feed((("attn_norm",),), "product", "ssm_beta"),
    "beta_sigmoid": Feed((("beta", "b"),)),
    "alpha": Feed((("attn_norm",),), "product", "ssm_alpha"),
    "linear_attn_mixed_ba": Feed((("attn_norm",),), "product", "ssm_ba"),  # Qwen3-Next's b and a, its views
    "b": Feed((("linear_attn_mixed_ba",),)),
    "a": Feed((("linear_attn_mixed_ba",),)),
    "a_softplus": Feed((("alpha", "a"),)),
    "gate": Feed((("a_softplus",),)),
    "conv_output_raw": Feed((("linear_attn_qkv_mixed",),)),
    "conv_output_silu": Feed((("conv_output_raw",),)),
    "q_conv": Feed((("conv_output_silu",),)),
    "k_conv": Feed((("conv_output_silu",),)),
    "v_conv": Feed((("conv_output_silu",),)),
    "q_conv_predelta": Feed((("q_conv",),)),
    "k_conv_predelta": Feed((("k_conv",),)),
    "attn_output": Feed((("q_conv_predelta",), ("k_conv_predelta",), ("v_conv",), ("gate",), ("beta_sigmoid", "b"))),
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

SHARED_EXPERT_STAGES = ("ffn_gate", "ffn_up", "ffn_swiglu", "ffn_shexp", "shared_expert_gate",
                        "shared_expert_gate_sigmoid", "ffn_shexp_gated", "ffn_out")  # gated_shared_expert's, ffn_out
MOE_WIRING = {  # WIRING with Qwen3.5-MoE's shared expert: its products under the dense names, ffn_out the sum
    **WIRING, "ffn_gate": WIRING["ffn_gate"]._replace(weight="ffn_gate_shexp"),
    "ffn_up": WIRING["ffn_up"]._replace(weight="ffn_up_shexp"),
    "ffn_shexp": Feed((("ffn_swiglu",),), "product", "ffn_down_shexp"),
    "shared_expert_gate": Feed((("ffn_norm",),), "product", "ffn_gate_inp_shexp"),
    "shared_expert_gate_sigmoid": Feed((("shared_expert_gate",),)),
    "ffn_shexp_gated": Feed((("ffn_shexp",), ("shared_expert_gate_sigmoid",))),
    "ffn_out": Feed((("ffn_moe_out",), ("ffn_shexp_gated",)), "sum")}
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
    h = feed_forward(h, lw, cfg, ops, i)  # [T, D]
    return tap("l_out", i, x + h)  # [T, D]


def feed_forward(h, lw, cfg, ops, i):  # [T, D] -> [T, D]: SwiGLU, or experts plus the sigmoid-gated shared expert
    if not cfg.is_moe(i):
        return blocks.gated_ffn(h, lw, ops, "swiglu", i)
    out = blocks.moe_ffn(h, lw, cfg, ops, i)  # [T, D]
    return tap("ffn_out", i, out + gated_shared_expert(h, lw, ops, i)) if cfg.n_ff_shexp else out


def gated_shared_expert(h, lw, ops, i):  # [T, D] -> [T, D]: Qwen3.5-MoE's shared expert times sigmoid(h . w)
    out = blocks.gated_ffn(h, lw, ops, "swiglu", i, part="_shexp")  # [T, D]
    gate = tap("shared_expert_gate", i, linear(h, lw["ffn_gate_inp_shexp"]))  # [T, 1]
    return tap("ffn_shexp_gated", i, out * tap("shared_expert_gate_sigmoid", i, ops.sigmoid(gate)))


def linear_attention(h, lw, cfg, ops, i, at):  # [T, D] -> [T, D]: Gated DeltaNet, its state carried in the cache
    xp = array_module(h)
    T, LK, LV, LD = len(h), cfg.linear_k_heads, cfg.linear_v_heads, cfg.linear_head_dim
    qkv = tap("linear_attn_qkv_mixed", i, linear(h, lw["attn_qkv"]))  # [T, C]
    z = tap("z", i, linear(h, lw["attn_gate"]))  # [T, LV*LD]
    if "ssm_ba" in lw:  # Qwen3-Next: per q/k head its v heads' b, then their a (its graph names no sigmoid)
        ba = tap("linear_attn_mixed_ba", i, linear(h, lw["ssm_ba"])).reshape(T, LK, 2, LV // LK)
        b, alpha = tap("b", i, ba[:, :, 0].reshape(T, LV)), tap("a", i, ba[:, :, 1].reshape(T, LV))  # grouped
        beta = ops.sigmoid(b)  # [T, LV]
    else:
        b, alpha = tap("beta", i, linear(h, lw["ssm_beta"])), tap("alpha", i, linear(h, lw["ssm_alpha"]))  # [T, LV]
        beta = tap("beta_sigmoid", i, ops.sigmoid(b))
    g = tap("gate", i, tap("a_softplus", i, ops.softplus(alpha + lw["ssm_dt"])) * lw["ssm_a"])  # [T, LV]: log decay
    conv_state, state = at.cache.recurrent(i, at.start_pos)  # [CK-1, C], [LV, LD, LD]
    conv, conv_state = ops.ssm_conv(qkv, conv_state, lw["ssm_conv1d"])  # [T, C]
    conv = tap("conv_output_silu", i, ops.silu(tap("conv_output_raw", i, conv)))
    q = tap("q_conv", i, conv[:, :LK * LD].reshape(T, LK, LD))
    k = tap("k_conv", i, conv[:, LK * LD:2 * LK * LD].reshape(T, LK, LD))
    v = tap("v_conv", i, conv[:, 2 * LK * LD:].reshape(T, LV, LD))
    q, k = ops.l2_norm(q, cfg.rms_eps), ops.l2_norm(k, cfg.rms_eps)  # [T, LK, LD]
    if cfg.linear_v_order == "tiled":  # v head h reads q/k head h % LK; llama.cpp's names: before the tiling
        q, k = tap("q_conv_predelta", i, q), tap("k_conv_predelta", i, k)
        q, k = (xp.tile(a, (1, LV // LK, 1)) for a in (q, k))  # [T, LV, LD]
    else:  # grouped: v head h reads q/k head h // (LV / LK); llama.cpp's names: after the repeat
        q, k = (xp.repeat(a, LV // LK, axis=1) for a in (q, k))  # [T, LV, LD]
        q, k = tap("q_conv_predelta", i, q), tap("k_conv_predelta", i, k)
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
    stages = tuple(s for s in stages if s not in other)
    return blocks.block_stages(stages, cfg, i, SHARED_EXPERT_STAGES if cfg.n_ff_shexp else ())


def gguf_config(g, arch, every, **fields):
    """A hybrid's ModelConfig from GGUF: the `{arch}.ssm.*` sizes as llama.cpp reads them (its v heads as wide as its
    k heads: state_size both), the recurrent layers as listed, or all but each `every`-th (full_attention_interval,
    the family's by default); `fields` the family's own."""
    n = lambda key, default=None: int(g.integer(f"{arch}.{key}", default))  # noqa: E731
    n_layer = hparams.block_count(g, arch)
    if g.has(f"{arch}.attention.recurrent_layers"):
        recurrent = g.array(f"{arch}.attention.recurrent_layers", (GGUFValueType.BOOL,), "bools")
    else:
        every = n("full_attention_interval", every)
        recurrent = [(i + 1) % every != 0 for i in range(n_layer)]
    LD, LV = n("ssm.state_size"), n("ssm.time_step_rank")
    if n("ssm.inner_size") != LV * LD:
        raise RefllamaError(f"{g.path}: metadata field '{arch}.ssm.inner_size' is {n('ssm.inner_size')}, not "
                            f"{LV} v heads x {LD} (ssm.state_size)")
    return hparams.gguf_config(g, "half", **linear_fields(
        n_layer, recurrent, g.path, linear_k_heads=n("ssm.group_count"), linear_v_heads=LV, linear_head_dim=LD,
        conv_kernel=n("ssm.conv_kernel")), **fields)


def hf_config(c, arch, every, **fields):
    """A hybrid's (ModelConfig, rope) from config.json: `layer_types` (or all but each full_attention_interval-th
    layer linear), the linear attention's heads (k and v heads as wide, as llama.cpp computes them), a quarter of each
    head rotated by default; the feed-forward's width the experts' where the config gives no intermediate_size."""
    hparams.refuse(c, "attention_bias", arch)
    n_layer = c.need("num_hidden_layers", int)
    types = c.get("layer_types", kind=(list,))
    if types is None:
        every = c.get("full_attention_interval", every, kind=(int,))
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n_layer)]
    if not all(t in ("linear_attention", "full_attention") for t in types):
        raise RefllamaError(f"{c.path}: field 'layer_types' must list linear_attention or full_attention per layer")
    LD = c.need("linear_key_head_dim", int)
    if c.need("linear_value_head_dim", int) != LD:
        raise RefllamaError(f"{c.path}: linear_value_head_dim {c.get('linear_value_head_dim')} differs from "
                            f"linear_key_head_dim {LD} (llama.cpp's delta rule needs them equal)")
    return hparams.hf_config(c, arch, "half", partial_default=0.25, n_ff=fields.get("n_ff_exp"), **linear_fields(
        n_layer, [t == "linear_attention" for t in types], c.path, linear_k_heads=c.need("linear_num_key_heads", int),
        linear_v_heads=c.need("linear_num_value_heads", int), linear_head_dim=LD,
        conv_kernel=c.need("linear_conv_kernel_dim", int)), **fields)


def linear_fields(n_layer, recurrent, path, **sizes):  # -> ModelConfig's linear-attention fields
    if len(recurrent) != n_layer:
        raise RefllamaError(f"{path}: {len(recurrent)} layer types for {n_layer} layers")
    return {"recurrent_layers": tuple(bool(r) for r in recurrent), **sizes}
