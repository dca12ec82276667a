"""DeepSeek-V3 and its architecture's descendants (Kimi K2, Moonlight; DeepSeek-V2's files where they say so): GGUF
architecture `deepseek2`, as llama.cpp's src/models/deepseek2.cpp and transformers' modeling_deepseek_v3.py compute it.

Multi-head latent attention (MLA): q through a low-rank q_a, its RMSNorm and q_b (one projection where the file has
no q_lora_rank); k and v through one latent c of KL dims a token (kv_cmpr, RMS-normed) and one rotated k_pe shared by
the heads. A head's k is [k_nope, k_pe], its q [q_nope, q_pe]; RoPE turns only the *_pe dims. The paper's form, which
numerics float32 computes, expands the latent into every head's k_nope and v (`kv`) and caches them. llama.cpp's form
(numerics "ggml", `ops.mla_absorbed`) caches the latent instead and folds the expansion into q (q_nope_absorbed =
k_b q_nope, scored against c) and into the output (v_b times the heads' mix of latents): one cached head of KL + R.
The softmax scale carries YaRN's mscale squared.

The feed-forward: dense first layers, then DeepSeek-V3's routing (blocks.moe_ffn): sigmoid scores, a selection bias,
expert groups, the weights renormalised and scaled, shared experts added ungated."""

import dataclasses
import math

import numpy as np

from ..layers import linear, yarn_mscale
from ..trace import tap
from ..xp import array_module
from . import blocks, tables
from .hparams import block_count, gguf_config, gguf_moe, hf_config, hf_deepseek_moe, refuse, rope_parameters
from .tables import Weight

NAME = "deepseek2"
HF_ARCHITECTURES = ("DeepseekV3ForCausalLM",)
ROPE_LAYOUT = "interleaved"  # NORM pairs; transformers' rope_interleave (the released configs set it) rotates the same
# pairs of the same stored weights; a config with rope_interleave false rotates NEOX pairs ("half")
LATENT_EPS = 1e-6  # transformers' q_a_layernorm and kv_a_layernorm: DeepseekV3RMSNorm's default, not rms_norm_eps

WEIGHTS = (tables.TOKEN_EMBD, tables.OUTPUT_NORM, tables.OUTPUT)
LAYER_WEIGHTS = (  # a dense lead layer's; tables.layer_rows swaps in the experts
    tables.ATTN_NORM,
    # q: through q_lora_rank (DeepSeek-V3, Kimi K2) or one projection (Moonlight, DeepSeek-V2-Lite)
    Weight("attn_q_a", "QL, D", "attn_q_a.weight", "self_attn.q_a_proj.weight", required=False),
    Weight("attn_q_a_norm", "QL", "attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight", required=False),
    Weight("attn_q_b", "H*HD, QL", "attn_q_b.weight", "self_attn.q_b_proj.weight", required=False),
    Weight("attn_q", "H*HD, D", "attn_q.weight", "self_attn.q_proj.weight", required=False),
    Weight("attn_kv_a_mqa", "KL + R, D", "attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"),
    Weight("attn_kv_a_norm", "KL", "attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"),
    # the latent's expansion, per head: k_b [KL, NOPE] (llama.cpp's, absorbed into q), its transpose [NOPE, KL]
    # (the paper's k up-projection), v_b [VD, KL]; split from HF's kv_b_proj as llama.cpp's converter splits it
    # (HF's kv_b_proj [H * (NOPE + VD), KL]: per head k_nope's rows, then v's)
    Weight("attn_k_b", "H, KL, NOPE", "attn_k_b.weight", "self_attn.kv_b_proj.weight", hf_heads=(0, ("NOPE", "VD")),
           hf_transpose=True, per_head=True),
    Weight("attn_k_up", "H, NOPE, KL", "attn_k_b.weight", "self_attn.kv_b_proj.weight", hf_heads=(0, ("NOPE", "VD")),
           gguf_transpose=True),
    Weight("attn_v_b", "H, VD, KL", "attn_v_b.weight", "self_attn.kv_b_proj.weight", hf_heads=(1, ("NOPE", "VD")),
           per_head=True),
    tables.ATTN_OUTPUT._replace(shape="D, H*VD"), tables.FFN_NORM, tables.FFN_GATE, tables.FFN_UP, tables.FFN_DOWN)
MOE_WEIGHTS = tables.DEEPSEEK_MOE
INPUTS = blocks.PRE_NORM_INPUTS
# the stages of both forms: q, the latent and the rotated parts, then the paper's expansion (kv) or llama.cpp's
# absorption (q_nope_absorbed, Qcur, Kcur, kqv: the heads' mix of latents), the scores and output they share
EXPANDED_STAGES, ABSORBED_STAGES = ("kv",), ("q_nope_absorbed", "Qcur", "Kcur", "kqv")  # one form's alone
STAGES = ("attn_norm", "q_a_norm", "q", "kv_cmpr_pe", "kv_cmpr", "k_pe", "q_nope", "q_pe", "kv",
          "q_nope_absorbed", "Qcur", "Kcur", "kq", "kq_soft_max", "kqv", "kqv_out", "attn_out", "ffn_inp", "ffn_norm",
          *blocks.DENSE_FFN_STAGES, "l_out")
SHARED_EXPERT_STAGES = blocks.UNGATED_SHARED_EXPERT_STAGES
WIRING = {**blocks.SHARED_EXPERT_WIRING, "kq": blocks.Feed((("q_pe",), ("k_pe",))),
          "kqv_out": blocks.Feed((("kq_soft_max",), ("kv_cmpr",))),
          "attn_out": blocks.Feed((("kqv_out",),), "product", "attn_output")}
# llama.cpp's graph names q's three products "q", the latent before and after its norm "kv_cmpr", k_pe and q_pe before
# and after RoPE alike: the last of each is the stage; Qcur and Kcur are concatenations
LLAMACPP_NAMES = {("q", "MUL_MAT"): "q", ("q", "MUL"): "q_a_norm", ("kv_cmpr_pe", "MUL_MAT"): "kv_cmpr_pe",
                  ("kv_cmpr", "MUL"): "kv_cmpr", ("k_pe", "ROPE"): "k_pe", ("q_nope", "VIEW"): "q_nope",
                  ("q_pe", "ROPE"): "q_pe", ("q_nope_absorbed", "MUL_MAT"): "q_nope_absorbed",
                  ("Qcur", "CONCAT"): "Qcur", ("Kcur", "CONCAT"): "Kcur", ("kqv", "MUL_MAT"): "kqv"}


def block_stages(cfg, i):
    stages = blocks.block_stages(STAGES, cfg, i, shared=SHARED_EXPERT_STAGES)
    return stages if cfg.q_lora_rank else tuple(s for s in stages if s != "q_a_norm")  # one q projection


def kq_scale_f32(head_dim, rope_scale, yarn, log_mul, attn_factor=1.0):
    """The softmax scale as llama.cpp's deepseek2 graph computes it, in float32: mscale squared over sqrt(head_dim),
    mscale = attn_factor_org (1 + 0.1 log_mul ln(factor)), attn_factor_org the context's yarn_attn_factor times
    1 + 0.1 ln(factor). With DeepSeek's YaRN (`log_mul`, mscale_all_dim) yarn_attn_factor is 1 / (1 + 0.1 ln(factor)),
    so that cos and sin are unscaled and attn_factor_org is 1."""
    f32 = np.float32

    def logf(x):
        return f32(math.log(f32(x)))
    freq_scale = f32(1) / f32(rope_scale)
    factor = f32(1) / freq_scale
    a = f32(1)  # llama_context's yarn_attn_factor
    if yarn:  # get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) = 1, or get_mscale(factor, 1)
        a = f32(1) if log_mul or factor <= 1 else f32(0.1) * f32(1) * logf(factor) + f32(1)
        a = a * (f32(1) / (f32(1) + f32(0.1) * logf(factor)))
    a = a * f32(attn_factor)
    ln = logf(f32(1) / freq_scale)
    mscale = a * (f32(1) + f32(0.1) * ln) * (f32(1) + f32(0.1) * f32(log_mul) * ln)
    return float(f32(1) * mscale * mscale / f32(math.sqrt(f32(head_dim))))


def config_from_gguf(g):
    """llama.cpp's reading: key_length_mla and value_length_mla the heads' k and v widths (key_length and
    value_length are the latent's), q_lora_rank 0 or absent for one q projection, yarn_log_multiplier 0.1
    mscale_all_dim (YaRN's mscale squared in the softmax scale); the routing as the file says (softmax where it
    names none: DeepSeek-V2's files), the blocks before any multi-token-prediction layers."""
    n_layer = block_count(g, NAME) - int(g.integer(f"{NAME}.nextn_predict_layers", 0, low=0))
    head_dim = int(g.integer(f"{NAME}.attention.key_length_mla"))
    log_mul = np.float32(g.real(f"{NAME}.rope.scaling.yarn_log_multiplier", 0.0)) / np.float32(0.1)  # as llama.cpp
    cfg = gguf_config(g, ROPE_LAYOUT, mscale_in_kq=True, n_layer=n_layer, head_dim=head_dim,
                      n_head_kv=int(g.integer(f"{NAME}.attention.head_count")),
                      q_lora_rank=int(g.integer(f"{NAME}.attention.q_lora_rank", 0, low=0)),
                      kv_lora_rank=int(g.integer(f"{NAME}.attention.kv_lora_rank")),
                      v_head_dim=int(g.integer(f"{NAME}.attention.value_length_mla")),
                      **gguf_moe(g, norm=False, gating="softmax", deepseek=True))
    scale = kq_scale_f32(head_dim, cfg.rope_scale, bool(cfg.rope_yarn), float(log_mul),
                         g.real(f"{NAME}.rope.scaling.attn_factor", 1.0))
    return dataclasses.replace(cfg, attn_scale=scale).checked(g.path)


def config_from_hf(c):
    """DeepseekV3ForCausalLM's config.json: MLA's ranks and head widths; YaRN's mscale_all_dim, its mscale squared in
    the softmax scale and mscale / mscale_all_dim (transformers' attention factor) on cos and sin; rope_interleave
    (false: NEOX pairs); the latents' norms at transformers' epsilon (LATENT_EPS)."""
    refuse(c, "attention_bias", "DeepSeek-V3: biased latent projections")  # neither reference has them either
    theta, s = rope_parameters(c)
    nope, rope_dim = c.need("qk_nope_head_dim", int), c.need("qk_rope_head_dim", int)
    yarn = bool(s) and s.get("rope_type", s.get("type")) == "yarn"
    mscale_all = float((s or {}).get("mscale_all_dim") or 0) if yarn else 0.0
    layout = ROPE_LAYOUT if c.get("rope_interleave", True, kind=(bool,)) else "half"
    head_dim, q_lora = nope + rope_dim, c.get("q_lora_rank", 0, kind=(int,))
    cfg, rope = hf_config(c, NAME, layout, head_dim=head_dim, n_head_kv=c.need("num_attention_heads", int),
                          rope_dim=rope_dim, q_lora_rank=q_lora, kv_lora_rank=c.need("kv_lora_rank", int),
                          v_head_dim=c.need("v_head_dim", int), latent_eps=LATENT_EPS, **hf_deepseek_moe(c))
    mscale = yarn_mscale(cfg.rope_scale, mscale_all) if mscale_all else 1.0  # transformers' yarn_get_mscale
    fields = {"attn_scale": mscale * mscale / math.sqrt(head_dim)}
    if yarn:  # cos and sin times transformers' attention factor itself (hf_config divided yarn_mscale out)
        fields.update(rope_attn_factor=cfg.rope_attn_factor * yarn_mscale(cfg.rope_scale), rope_mscale_in_kq=True)
    return dataclasses.replace(cfg, **fields).checked(c.path), rope


def llamacpp_differs(cfg):  # -> why llama.cpp computes another model than this config's, or None
    if cfg.rope_layout != ROPE_LAYOUT:
        return ("this config's rope_interleave is false (q_pe and k_pe rotated in NEOX pairs); llama.cpp's deepseek2 "
                "graph always rotates adjacent pairs, so it computes another model (docs/references.md)")
    if cfg.rope_mscale_in_kq and abs(cfg.rope_attn_factor - 1.0) > 1e-7:
        return (f"this config's YaRN mscale differs from its mscale_all_dim (cos and sin times their ratio, "
                f"{cfg.rope_attn_factor:.6g}); a GGUF file carries mscale_all_dim alone and llama.cpp takes mscale to "
                "equal it, so it computes another model; transformers and DeepSeek's reference code take the ratio "
                "(docs/references.md)")
    return None


def latent_attention(h, lw, cfg, ops, i, at):  # [T, D] -> [T, D]
    """Multi-head latent attention, in the numerics' form: expanded (the paper's) or absorbed (llama.cpp's)."""
    xp = array_module(h)
    T, H, R, KL = len(h), cfg.n_head, cfg.rope_dim, cfg.kv_lora_rank
    NOPE, eps = cfg.head_dim - R, cfg.latent_eps or cfg.rms_eps
    if cfg.q_lora_rank:
        q = tap("q_a_norm", i, ops.rms_norm(linear(h, lw["attn_q_a"]), lw["attn_q_a_norm"], eps))  # [T, QL]
        q = linear(q, lw["attn_q_b"])
    else:
        q = linear(h, lw["attn_q"])
    q = tap("q", i, q.reshape(T, H, NOPE + R))  # [T, H, HD]
    kv_cmpr_pe = tap("kv_cmpr_pe", i, linear(h, lw["attn_kv_a_mqa"]))  # [T, KL + R]
    c = tap("kv_cmpr", i, ops.rms_norm(kv_cmpr_pe[:, :KL], lw["attn_kv_a_norm"], eps))  # [T, KL]: the latent
    rope = ops.rope[cfg.rope_layout]
    k_pe = tap("k_pe", i, rope(kv_cmpr_pe[:, None, KL:], at.cos, at.sin))  # [T, 1, R]: one for every head
    q_nope = tap("q_nope", i, q[:, :, :NOPE])  # [T, H, NOPE]
    q_pe = tap("q_pe", i, rope(q[:, :, NOPE:], at.cos, at.sin))  # [T, H, R]
    if ops.mla_absorbed:  # q scored against the latent itself: k_b folded into q, v_b applied after the mix
        q_nope = tap("q_nope_absorbed", i, per_head(q_nope, lw["attn_k_b"], ops))  # [T, H, KL]
        q = tap("Qcur", i, xp.concatenate([q_nope, q_pe], axis=2))  # [T, H, KL + R]
        k = tap("Kcur", i, xp.concatenate([c[:, None], k_pe], axis=2))  # [T, 1, KL + R], cached; V its first KL
        mix = blocks.attention(q, k, None, cfg, ops, i, at, name="kqv")  # [T, H*KL]
        out = tap("kqv_out", i, per_head(mix.reshape(T, H, KL), lw["attn_v_b"], ops).reshape(T, -1))  # [T, H*VD]
    else:  # the paper's: each head's k_nope and v expanded from the latent, k_pe shared by the heads
        kv = tap("kv", i, xp.concatenate([per_head(c, lw["attn_k_up"], ops), per_head(c, lw["attn_v_b"], ops)], axis=2))
        k_nope, v = kv[:, :, :NOPE], kv[:, :, NOPE:]  # [T, H, NOPE], [T, H, VD]
        q = xp.concatenate([q_nope, q_pe], axis=2)  # [T, H, HD]
        k = xp.concatenate([k_nope, xp.broadcast_to(k_pe, (T, H, R))], axis=2)  # [T, H, HD]
        out = blocks.attention(q, k, v, cfg, ops, i, at)  # [T, H*VD]: kqv_out
    return tap("attn_out", i, linear(out, lw["attn_output"]))  # [T, D]


def per_head(x, mats, ops):  # [T, H, K] or [T, K] (every head's input), H matrices [N, K] -> [T, H, N]
    """Each head's rows times its own matrix (llama.cpp's MUL_MAT of a 3-D weight). A decode step's one token takes
    them as a token takes its experts (ops.mul_mat_id: one kernel call for the H products where the backend joins
    the matrices), the same products."""
    xp = array_module(x)
    if len(x) == 1:
        return ops.mul_mat_id(x, mats, xp.arange(len(mats))[None])  # [1, H, N]
    return xp.stack([linear(x if x.ndim == 2 else x[:, h], m) for h, m in enumerate(mats)], axis=1)


def latent_block(x, lw, cfg, ops, i, at, last_only=False):  # [T, D] -> [T, D] ([1, D]: last_only), layer i
    h = tap("attn_norm", i, ops.rms_norm(x, lw["attn_norm"], cfg.rms_eps))  # [T, D]
    h = latent_attention(h, lw, cfg, ops, i, at)  # [T, D]
    if last_only:  # only the last row goes on
        x, h = x[-1:], h[-1:]  # [1, D]
    x = tap("ffn_inp", i, x + h)  # [T, D]
    h = tap("ffn_norm", i, ops.rms_norm(x, lw["ffn_norm"], cfg.rms_eps))  # [T, D]
    h = blocks.feed_forward(h, lw, cfg, ops, i)  # [T, D]: dense, or the experts and the shared experts
    return tap("l_out", i, x + h)  # [T, D]


def forward(w, cfg, ops, tokens, start_pos, cache, last_only=False):  # [T] -> [T or 1, V] logits
    return blocks.decoder_forward(w, cfg, ops, tokens, start_pos, cache, last_only, latent_block)
