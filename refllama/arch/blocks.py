"""The stages the architectures build their forwards from, as llama.cpp's src/models/*.cpp build theirs from
build_norm, build_attn and build_ffn: each a pure function of arrays and a layer's weights, each stage handed to
`tap` under llama.cpp's graph name. `ops` is the numerics' operations table (refllama.layers.Ops): the steps whose
arithmetic a numerics chooses are always called through it.

`pre_norm_forward` is the forward of Llama and of the families that differ from it only in data (Qwen2's biases,
Phi-3's fused matrices split at load, Qwen3's per-head q/k norms, OLMoE's q/k norms over the whole projection, a
mixture of experts where a layer has a router): embeddings, n_layer blocks of attention and a SwiGLU feed-forward,
each after an RMSNorm and added to the residual, a last norm, logits.
"""

from typing import NamedTuple

from ..layers import causal_mask, embedding, linear
from ..trace import tap
from ..xp import array_module

# A block's stages in named parts, as the functions below tap them; a family's STAGES joins the parts its block has.
QKV_STAGES = ("Qcur", "Kcur", "Vcur")  # qkv's
QK_NORM_STAGES = ("Qcur_normed", "Kcur_normed")  # qk_norm's, after Vcur (Qwen3, Gemma 3)
ROPE_STAGES = ("Qcur_rope", "Kcur_rope")  # rope_qk's: none on a NoPE layer
ATTEND_STAGES = ("kq", "kq_soft_max", "kqv_out", "attn_out")  # attend's (kq_scaled_2 between where scores are capped)
DENSE_FFN_STAGES = ("ffn_gate", "ffn_up", "ffn_swiglu", "ffn_out")  # gated_ffn's
PRE_NORM_INPUTS = ("inp_embd",)  # the stages pre_norm_forward taps before the first block


def pre_norm_stages(qk_norm=False):  # -> the stages of pre_norm_block, with qk_norm's where the layers have the norms
    return ("attn_norm", *QKV_STAGES, *(QK_NORM_STAGES if qk_norm else ()), *ROPE_STAGES, *ATTEND_STAGES, "ffn_inp",
            "ffn_norm", *DENSE_FFN_STAGES, "l_out")


ROUTING_STAGES = ("ffn_moe_logits", "ffn_moe_probs", "ffn_moe_topk", "ffn_moe_weights")  # moe_ffn's, in order:
BIAS_STAGES = ("ffn_moe_probs_biased",)  # after ffn_moe_probs where a selection bias chooses (DeepSeek-V3's)
GROUP_STAGES = ("ffn_moe_group_topk", "ffn_moe_probs_masked")  # then, where the experts are grouped
NORM_W_STAGES = ("ffn_moe_weights_sum", "ffn_moe_weights_norm")  # where the K weights are renormalised
SCALE_W_STAGES = ("ffn_moe_weights_scaled",)  # where they are scaled (expert_scale)
EXPERT_STAGES = ("ffn_moe_gate", "ffn_moe_up", "ffn_moe_swiglu", "ffn_moe_down", "ffn_moe_weighted", "ffn_moe_out")
MOE_STAGES = (*ROUTING_STAGES[:2], *BIAS_STAGES, *GROUP_STAGES, *ROUTING_STAGES[2:], *NORM_W_STAGES, *SCALE_W_STAGES,
              *EXPERT_STAGES)  # every stage moe_ffn may tap, but gpt-oss's:
# gpt-oss's (llama.cpp's SOFTMAX_WEIGHT router, biased experts, the clamped SwiGLU), in order
OAI_MOE_STAGES = (*ROUTING_STAGES, "ffn_moe_weights_softmax", "ffn_moe_gate", "ffn_moe_gate_biased", "ffn_moe_up",
                  "ffn_moe_up_biased", "ffn_moe_swiglu_oai", "ffn_moe_down", "ffn_moe_down_biased", "ffn_moe_weighted",
                  "ffn_moe_out")
# shared_expert's, as llama.cpp's qwen2moe graph names them (its build_ffn taps ffn_gate/up/swiglu inside)
SHARED_EXPERT_STAGES = ("ffn_shexp_gate_inp", "ffn_shexp_gate", "ffn_gate", "ffn_up", "ffn_swiglu", "ffn_shexp",
                        "ffn_shexp_out", "ffn_out")
MIN_WEIGHT_SUM = 6.103515625e-5  # llama.cpp clamps the routing weights' sum to float16's smallest normal number


class Feed(NamedTuple):
    """How a block's stage is made: the stages it reads, each a tuple of alternatives (the first one the family taps
    is the one; IN: the residual stream entering the block), and what it is: a "norm" or a "product" of its layer
    `weight`, a residual "sum" (the stream, then what it adds), or another "step"."""

    reads: tuple
    kind: str = "step"
    weight: str | None = None


IN = "<in>"  # the residual stream entering a block: the last input stage, or the block before's l_out
RESIDUAL = ("sa_out", "ffn_inp")  # the stream after attention's residual sum (Gemma's sa_out)
UNIT = ("ffn_swiglu", "ffn_geglu", "ffn_gelu")  # the feed-forward's gated unit (or GPT-2's plain GELU)
# Every block's wiring, declared once: which stage feeds which (the harness derives its tables from it: compare's
# stream stages, the hints' norms, residual sums, projections and inputs)
WIRING = {
    "attn_norm": Feed(((IN,),), "norm", "attn_norm"),
    "Qcur": Feed((("attn_norm", IN),), "product", "attn_q"),  # OLMo 2: no norm before attention
    "Kcur": Feed((("attn_norm", IN),), "product", "attn_k"),
    "Vcur": Feed((("attn_norm", IN),), "product", "attn_v"),
    "Qcur_normed": Feed((("Qcur",),), "norm", "attn_q_norm"),
    "Kcur_normed": Feed((("Kcur",),), "norm", "attn_k_norm"),
    "Qcur_rope": Feed((("Qcur_normed", "Qcur"),)),
    "Kcur_rope": Feed((("Kcur_normed", "Kcur"),)),
    "kq": Feed((("Qcur_rope", "Qcur_normed", "Qcur"), ("Kcur_rope", "Kcur_normed", "Kcur"))),  # NoPE: unrotated
    "kq_scaled_2": Feed((("kq",),)),  # Gemma 2's soft-capped scores
    "kq_soft_max": Feed((("kq_scaled_2", "kq"),)),
    "kqv_out": Feed((("kq_soft_max",), ("Vcur",))),
    "attn_out": Feed((("kqv_out",),), "product", "attn_output"),
    "attn_post_norm": Feed((("attn_out",),), "norm", "attn_post_norm"),
    "sa_out": Feed(((IN,), ("attn_post_norm", "attn_out")), "sum"),
    "ffn_inp": Feed(((IN,), ("attn_post_norm", "attn_out")), "sum"),
    "ffn_norm": Feed((RESIDUAL,), "norm", "ffn_norm"),
    "ffn_gate": Feed((("ffn_norm", *RESIDUAL),), "product", "ffn_gate"),  # OLMo 2: no norm before it
    "ffn_up": Feed((("ffn_norm", *RESIDUAL),), "product", "ffn_up"),
    "ffn_swiglu": Feed((("ffn_gate",), ("ffn_up",))),
    "ffn_geglu": Feed((("ffn_gate",), ("ffn_up",))),
    "ffn_gelu": Feed((("ffn_up",),)),
    "ffn_out": Feed((UNIT,), "product", "ffn_down"),
    "ffn_post_norm": Feed((("ffn_out",),), "norm", "ffn_post_norm"),
    "l_out": Feed((RESIDUAL, ("ffn_post_norm", "ffn_out", "ffn_moe_out")), "sum"),
    "ffn_moe_logits": Feed((("ffn_norm",),), "product", "ffn_gate_inp"),
    "ffn_moe_probs": Feed((("ffn_moe_logits",),)),
    "ffn_moe_probs_biased": Feed((("ffn_moe_probs",),)),
    "ffn_moe_group_topk": Feed((("ffn_moe_probs_biased", "ffn_moe_probs"),)),
    "ffn_moe_probs_masked": Feed((("ffn_moe_probs_biased", "ffn_moe_probs"), ("ffn_moe_group_topk",))),
    "ffn_moe_topk": Feed((("ffn_moe_probs_masked", "ffn_moe_probs_biased", "ffn_moe_probs"),)),
    "ffn_moe_weights": Feed((("ffn_moe_probs",), ("ffn_moe_topk",))),
    "ffn_moe_weights_sum": Feed((("ffn_moe_weights",),)),
    "ffn_moe_weights_norm": Feed((("ffn_moe_weights",), ("ffn_moe_weights_sum",))),
    "ffn_moe_weights_softmax": Feed((("ffn_moe_weights",),)),
    "ffn_moe_weights_scaled": Feed((("ffn_moe_weights_norm", "ffn_moe_weights"),)),
    "ffn_moe_gate": Feed((("ffn_norm",), ("ffn_moe_topk",)), "product", "ffn_gate_exps"),
    "ffn_moe_gate_biased": Feed((("ffn_moe_gate",), ("ffn_moe_topk",))),
    "ffn_moe_up": Feed((("ffn_norm",), ("ffn_moe_topk",)), "product", "ffn_up_exps"),
    "ffn_moe_up_biased": Feed((("ffn_moe_up",), ("ffn_moe_topk",))),
    "ffn_moe_swiglu": Feed((("ffn_moe_gate",), ("ffn_moe_up",))),
    "ffn_moe_swiglu_oai": Feed((("ffn_moe_gate_biased",), ("ffn_moe_up_biased",))),
    "ffn_moe_down": Feed((("ffn_moe_swiglu", "ffn_moe_swiglu_oai"), ("ffn_moe_topk",)), "product", "ffn_down_exps"),
    "ffn_moe_down_biased": Feed((("ffn_moe_down",), ("ffn_moe_topk",))),
    "ffn_moe_weighted": Feed((("ffn_moe_down_biased", "ffn_moe_down"),
                              ("ffn_moe_weights_scaled", "ffn_moe_weights_norm", "ffn_moe_weights_softmax",
                               "ffn_moe_weights"))),
    "ffn_moe_out": Feed((("ffn_moe_weighted",),)),
    "ffn_shexp_gate_inp": Feed((("ffn_norm",),), "product", "ffn_gate_inp_shexp"),
    "ffn_shexp_gate": Feed((("ffn_shexp_gate_inp",),)),
    "ffn_shexp": Feed((("ffn_swiglu",),), "product", "ffn_down_shexp"),
    "ffn_shexp_out": Feed((("ffn_shexp",), ("ffn_shexp_gate",))),
}
# DeepSeek's and GLM-4.5's shared expert, ungated: the dense stages, ffn_shexp its output, ffn_out the sum
UNGATED_SHARED_EXPERT_STAGES = ("ffn_gate", "ffn_up", "ffn_swiglu", "ffn_shexp", "ffn_out")
# Qwen2-MoE's shared expert taps the dense names for its own products, and ffn_out is the two outputs' sum
SHARED_EXPERT_WIRING = {**WIRING, "ffn_gate": WIRING["ffn_gate"]._replace(weight="ffn_gate_shexp"),
                        "ffn_up": WIRING["ffn_up"]._replace(weight="ffn_up_shexp"),
                        "ffn_out": Feed((("ffn_moe_out",), ("ffn_shexp_out", "ffn_shexp")), "sum")}


def wiring(table, stages, inputs):  # -> {stage: Feed with each read the one stage the family taps (or IN)}
    """`table` (WIRING) resolved for a family whose blocks tap `stages` (every one, dense or not) after `inputs`."""
    have = {*stages, IN}
    return {s: f._replace(reads=tuple(next((r for r in alts if r in have), alts[-1]) for alts in f.reads))
            for s, f in table.items() if s in stages}


def block_input(inputs, layer):  # the residual stream entering block `layer` (`inputs`: the family's INPUTS)
    return inputs[-1] if layer == 0 else f"l_out-{layer - 1}"


def replaced(stages, part, new):  # -> stages with the run of stages `part` replaced by `new`
    at = stages.index(part[0])
    assert stages[at:at + len(part)] == part, f"{part} is not a run of {stages}"
    return (*stages[:at], *new, *stages[at + len(part):])


def moe_stage_order(stages, shared=SHARED_EXPERT_STAGES, moe=MOE_STAGES):
    """Every stage a block of a family with mixtures of experts may tap, dense or not, in forward order; `shared`: its
    shared expert's stages (Qwen2-MoE's unless the family says), `moe` its mixture's (gpt-oss's: OAI_MOE_STAGES)."""
    return replaced(stages, DENSE_FFN_STAGES, (*moe, *shared))


def block_stages(stages, cfg, i, shared=SHARED_EXPERT_STAGES, moe=None):
    """The stages of block i, given the family's dense block `stages`: its feed-forward's replaced by moe_ffn's
    (`moe`, where the family's differ from blocks'; and the `shared` expert's) where layer i is a mixture of
    experts, no rotated q/k on a NoPE layer."""
    if cfg.is_nope(i):
        stages = tuple(s for s in stages if s not in ROPE_STAGES)
    if not cfg.is_moe(i):
        return stages
    moe = moe or (*ROUTING_STAGES[:2], *(BIAS_STAGES if cfg.expert_bias else ()),
                  *(GROUP_STAGES if cfg.expert_groups > 1 else ()), *ROUTING_STAGES[2:],
                  *(NORM_W_STAGES if cfg.expert_norm else ()), *(SCALE_W_STAGES if cfg.expert_scale != 1.0 else ()),
                  *EXPERT_STAGES)
    return replaced(stages, DENSE_FFN_STAGES, (*moe, *(shared if cfg.n_ff_shexp else ())))


class At(NamedTuple):
    """Where a step's T tokens are: their first position, the cache, their rows of the RoPE tables, their mask."""

    start_pos: int
    cache: object  # refllama.cache.Cache
    cos: object  # [T, R/2]
    sin: object  # [T, R/2]
    mask: object  # [T, S], S = start_pos + T


def positions(cache, start_pos, T, xp, window=None, local=False):  # -> At of T tokens from start_pos
    """`window`: a query sees only its last `window` keys; `local`: the RoPE tables of the sliding-window layers
    (Gemma 3's local layers have a base of their own)."""
    span = slice(start_pos, start_pos + T)
    cos, sin = (cache.cos_swa, cache.sin_swa) if local else (cache.cos, cache.sin)
    return At(start_pos, cache, cos[span], sin[span], causal_mask(start_pos, T, start_pos + T, xp, window))


def layer_positions(cfg, cache, start_pos, T, xp):  # -> one At per layer
    """Where each layer's T tokens are: a sliding-window layer's mask (and RoPE tables, where its base is its own)
    where the model has local layers, the model's window (if any) in every layer otherwise."""
    full = positions(cache, start_pos, T, xp)
    local = positions(cache, start_pos, T, xp, cfg.sliding_window, local=bool(cfg.rope_base_swa))
    return [local if cfg.is_windowed(i) else full for i in range(cfg.n_layer)]


def qkv(h, lw, cfg, i):  # [T, D] -> q [T, H, HD], k [T, KVH, HD], v [T, KVH, HD]: the projections, biases if any
    T = len(h)
    q = tap("Qcur", i, linear(h, lw["attn_q"], lw.get("attn_q_bias")).reshape(T, cfg.n_head, cfg.head_dim))
    k = tap("Kcur", i, linear(h, lw["attn_k"], lw.get("attn_k_bias")).reshape(T, cfg.n_head_kv, cfg.head_dim))
    v = tap("Vcur", i, linear(h, lw["attn_v"], lw.get("attn_v_bias")).reshape(T, cfg.n_head_kv, cfg.head_dim))
    return q, k, v


def qk_norm(q, k, lw, cfg, ops, i):  # [T, H, HD], [T, KVH, HD] -> same: each head RMS-normed over its HD dims
    """Or, where the norm's weight spans every head (OLMoE's H*HD), q and k each normed as one vector a token."""
    T = len(q)
    if lw["attn_q_norm"].shape[0] != cfg.head_dim:  # OLMoE: over the whole projection, before the head split
        q = q.reshape(T, 1, -1)  # [T, 1, H*HD]
        k = k.reshape(T, 1, -1)  # [T, 1, KVH*HD]
    q = tap("Qcur_normed", i, ops.rms_norm(q, lw["attn_q_norm"], cfg.rms_eps).reshape(T, cfg.n_head, -1))
    k = tap("Kcur_normed", i, ops.rms_norm(k, lw["attn_k_norm"], cfg.rms_eps).reshape(T, cfg.n_head_kv, -1))
    return q, k


def rope_qk(q, k, cfg, ops, at, i):  # [T, H, HD], [T, KVH, HD] -> same, rotated by position in the model's pairs
    rope = ops.rope[cfg.rope_layout]
    return tap("Qcur_rope", i, rope(q, at.cos, at.sin)), tap("Kcur_rope", i, rope(k, at.cos, at.sin))


def attend(q, k, v, lw, cfg, ops, i, at):  # q [T, H, HD], k, v [T, KVH, HD] -> [T, D]
    """attention (with the layer's sinks, gpt-oss's, where it has them), then the output projection."""
    attn = attention(q, k, v, cfg, ops, i, at, sinks=lw.get("attn_sinks"))  # [T, H*HD]
    return tap("attn_out", i, linear(attn, lw["attn_output"], lw.get("attn_output_bias")))  # [T, D]


def attention(q, k, v, cfg, ops, i, at, name="kqv_out", sinks=None):  # q [T, H, HD], k, v [T, KVH, HD] -> [T, H*HD]
    """Store k and v, then scores, softmax (a sink logit a head in its denominator where `sinks` [H] are given) and
    the weighted values, the heads side by side (stage `name`)."""
    k_all, v_all = at.cache.store(i, at.start_pos, k, v)  # [KVH, S, HD] each
    scale = array_module(q).float32(cfg.kq_scale)
    if ops.q_first:  # llama.cpp's graph: q times the scale (float32), then q.k; the stage stays q.k unscaled
        kq = ops.attention_scores(q * scale, k_all)  # [H, T, S]
        tap("kq", i, kq / scale)
    else:
        kq = tap("kq", i, ops.attention_scores(q, k_all))  # [H, T, S]
    if cfg.attn_softcap:  # Gemma 2: the scaled scores soft-capped (llama.cpp's kq_scaled_2), then the softmax
        kq = tap("kq_scaled_2", i, ops.softcap(kq if ops.q_first else kq * scale, cfg.attn_softcap))
    scaled = ops.q_first or cfg.attn_softcap
    p = tap("kq_soft_max", i, ops.attention_weights(kq, at.mask, 1.0 if scaled else cfg.kq_scale, sinks))  # [H, T, S]
    return tap(name, i, ops.attention_mix(p, v_all))  # [T, H*HD]


def gated_ffn(h, lw, ops, unit, i, part=""):  # [T, D] -> [T, D]: down(unit(gate(h), up(h))), biases if any
    """`unit`: "swiglu" (SiLU gate: Llama, Qwen, Phi-3) or "geglu" (GELU gate: Gemma), its stage `ffn_{unit}`;
    `part` "_shexp": the shared expert's matrices, its output stage `ffn_shexp` (llama.cpp's names)."""
    gate = tap("ffn_gate", i, linear(h, lw["ffn_gate" + part], lw.get("ffn_gate_bias")))  # [T, F]
    up = tap("ffn_up", i, linear(h, lw["ffn_up" + part], lw.get("ffn_up_bias")))  # [T, F]
    h = tap(f"ffn_{unit}", i, getattr(ops, unit)(gate, up))  # [T, F]
    return tap("ffn" + (part or "_out"), i, linear(h, lw["ffn_down" + part], lw.get("ffn_down_bias")))  # [T, D]


def moe_ffn(h, lw, cfg, ops, i):  # [T, D] -> [T, D]: the K chosen experts' feed-forwards, weighted, summed
    """A mixture of experts, as llama.cpp's build_moe_ffn computes it: a router's softmax over the E experts, the K
    most probable kept (ties to the lower id, as ggml's argsort: std::sort, an insertion sort up to 16 experts; past
    16 its order on exact ties is std::sort's), their probabilities renormalised where the family says so, each token
    through its K experts' SwiGLU feed-forwards, the K outputs weighted and added in slot order.
    gpt-oss's (expert_gating "softmax_weight"): the K largest of the router's biased logits kept, a softmax over those
    K; each expert's products biased (llama.cpp's add_id), its unit the clamped SwiGLU (oai_swiglu).
    DeepSeek-V3's and GLM-4.5's ("sigmoid"): each expert's sigmoid, a selection bias added to choose the experts but
    not to weigh them, the choice limited to the best groups of experts (expert_groups), the weights renormalised and
    scaled (routed_scaling_factor).
    Slot k of a token is its k-th most probable expert; `ffn_moe_topk` says which."""
    xp = array_module(h)
    T, K = len(h), cfg.n_expert_used
    logits = tap("ffn_moe_logits", i, linear(h, lw["ffn_gate_inp"]))  # [T, E]
    if "ffn_gate_inp_bias" in lw:  # gpt-oss's router bias
        logits = logits + lw["ffn_gate_inp_bias"]
    # [T, E]: what the experts are weighed by (gpt-oss: the biased logits themselves)
    probs = tap("ffn_moe_probs", i, {"softmax": ops.softmax, "sigmoid": ops.sigmoid,
                                     "softmax_weight": lambda x: x}[cfg.expert_gating](logits))
    chosen_by = probs  # [T, E]: what they are chosen by
    if cfg.expert_bias:  # DeepSeek-V3's selection bias
        chosen_by = tap("ffn_moe_probs_biased", i, probs + lw["ffn_exp_probs_b"])
    if cfg.expert_groups > 1:
        chosen_by = best_groups(chosen_by, cfg, i)
    ids = xp.argsort(-chosen_by, axis=1, kind="stable")[:, :K].astype(xp.float32)  # float32 as dumps hold it: exact
    topk = tap("ffn_moe_topk", i, ids).astype(xp.int64)  # [T, K] expert ids
    weights = tap("ffn_moe_weights", i, xp.take_along_axis(probs, topk, axis=1))  # [T, K]
    if cfg.expert_gating == "softmax_weight":
        weights = tap("ffn_moe_weights_softmax", i, ops.softmax(weights))  # [T, K]
    if cfg.expert_norm:
        total = tap("ffn_moe_weights_sum", i, weights.astype(xp.float64).cumsum(axis=1)[:, -1:].astype(xp.float32))
        # [T, 1]: added one by one in float64, as ggml_vec_sum_f32
        weights = tap("ffn_moe_weights_norm", i, weights / xp.maximum(total, xp.float32(MIN_WEIGHT_SUM)))
    if cfg.expert_scale != 1.0:
        weights = tap("ffn_moe_weights_scaled", i, weights * xp.float32(cfg.expert_scale))
    gate = expert_products(h, lw, "gate", topk, ops, i)  # [T, K, FE]: each slot h's row
    up = expert_products(h, lw, "up", topk, ops, i)  # [T, K, FE]
    if cfg.oai_swiglu:
        act = tap("ffn_moe_swiglu_oai", i, ops.swiglu_oai(gate, up, *cfg.oai_swiglu))
    else:
        act = tap("ffn_moe_swiglu", i, ops.swiglu(gate.reshape(T * K, -1), up.reshape(T * K, -1)).reshape(T, K, -1))
    down = expert_products(act, lw, "down", topk, ops, i)  # [T, K, D]
    weighted = tap("ffn_moe_weighted", i, down * weights[:, :, None])  # [T, K, D]
    out = weighted[:, 0]
    for k in range(1, K):  # slot by slot, as llama.cpp adds its K views
        out = out + weighted[:, k]
    return tap("ffn_moe_out", i, out)  # [T, D]


def best_groups(scores, cfg, i):  # [T, E] -> [T, E]: the experts outside each token's best groups at -inf
    """DeepSeek-V3's group-limited routing: the E experts in G equal groups, a group scored by the sum of its two best
    scores, the `expert_groups_used` best groups kept (ties to the lower group, as ggml's argsort)."""
    xp = array_module(scores)
    T, G = len(scores), cfg.expert_groups
    groups = scores.reshape(T, G, -1)  # [T, G, E/G]
    two = -xp.sort(-groups, axis=2)[:, :, :2]  # [T, G, 2]: each group's two best, the best first
    group_scores = two[:, :, 0] + two[:, :, 1]  # [T, G]: float32, as ggml's sum of two in float64 rounds
    best = xp.argsort(-group_scores, axis=1, kind="stable")[:, :cfg.expert_groups_used]  # [T, GU]
    tap("ffn_moe_group_topk", i, best.astype(xp.float32))
    keep = xp.zeros((T, G), dtype=bool)
    xp.put_along_axis(keep, best, True, axis=1)
    masked = xp.where(keep[:, :, None], groups, xp.float32(-xp.inf))  # [T, G, E/G]
    return tap("ffn_moe_probs_masked", i, masked.reshape(T, -1))


def expert_products(x, lw, part, topk, ops, i):  # [T, D] or [T, K, FE], ids [T, K] -> [T, K, out]: ffn_moe_{part}
    """Each slot's row times its expert's `part` matrix, plus the expert's bias where the layer has them (gpt-oss's:
    llama.cpp's add_id, `ffn_moe_{part}_biased`)."""
    y = tap(f"ffn_moe_{part}", i, ops.mul_mat_id(x, lw[f"ffn_{part}_exps"], topk))  # [T, K, out]
    bias = lw.get(f"ffn_{part}_exps_bias")  # [E, out]
    return y if bias is None else tap(f"ffn_moe_{part}_biased", i, y + bias[topk])


def shared_expert(h, lw, ops, i):  # [T, D] -> [T, D]: Qwen2-MoE's shared expert, behind a sigmoid gate
    """A dense SwiGLU feed-forward every token takes, times sigmoid(h . w), the sigmoid computed as llama.cpp's
    qwen2moe graph computes it: silu(x) / x."""
    g = tap("ffn_shexp_gate_inp", i, linear(h, lw["ffn_gate_inp_shexp"]))  # [T, 1]
    gate = tap("ffn_shexp_gate", i, ops.silu(g) / g)  # [T, 1]
    out = gated_ffn(h, lw, ops, "swiglu", i, part="_shexp")  # [T, D]
    return tap("ffn_shexp_out", i, out * gate)  # [T, D]


def pre_norm_forward(w, cfg, ops, tokens, start_pos, cache, last_only=False):  # [T] -> [T or 1, V] logits
    """Llama's forward: decoder_forward of pre_norm_block."""
    return decoder_forward(w, cfg, ops, tokens, start_pos, cache, last_only, pre_norm_block)


def decoder_forward(w, cfg, ops, tokens, start_pos, cache, last_only, block):  # [T] -> [T or 1, V] logits
    """Run T new tokens at positions start_pos.. through the model, writing their K/V into cache: embeddings
    (scaled where the family scales them: Gemma's sqrt(D), Granite's multiplier), n_layer of the family's `block`,
    a last norm, logits (divided, soft-capped where the family does).

    Prefill passes the whole prompt at once (matrix-matrix); decode passes one token. `last_only` computes logits
    for the last position only (all that generation needs): the last block keeps only that row once attention has
    run, where llama.cpp's graphs pick their output rows (inp_out_ids), so its feed-forward runs on one token.
    """
    T = len(tokens)
    cache.check_room(T)
    xp = array_module(w["output_norm"])
    at = layer_positions(cfg, cache, start_pos, T, xp)  # a local layer's window and RoPE tables, if any

    x = tap("inp_embd", None, embedding(xp.asarray(tokens), w["token_embd"]))  # [T, D]
    if cfg.embedding_scale is not None:
        x = tap("inp_scaled", None, x * xp.float32(cfg.embedding_scale))
    for i, lw in enumerate(w["layers"]):
        x = block(x, lw, cfg, ops, i, at[i], last_only and i == cfg.n_layer - 1)  # [T, D] (last: [1, D])
    cache.n_past = start_pos + T

    x = tap("result_norm", None, ops.rms_norm(x, w["output_norm"], cfg.rms_eps))  # [T, D]
    logits = linear(x, w["output"])  # [T, V]
    if cfg.logit_scale != 1.0:  # Granite's, as llama.cpp scales: by float32(1 / logit_scale)
        logits = logits * xp.float32(1.0 / cfg.logit_scale)
    if cfg.logit_softcap:
        logits = ops.softcap(logits, cfg.logit_softcap)
    return tap("result_output", None, logits)


def feed_forward(h, lw, cfg, ops, i):  # [T, D] -> [T, D]: layer i's feed-forward, chosen as llama.cpp's graphs do
    """A SwiGLU feed-forward, or where the layer has a router a mixture of experts, plus the shared expert where the
    model has one: behind a gate where it has one (Qwen2-MoE), else added as it is (DeepSeek's, GLM-4.5's)."""
    if not cfg.is_moe(i):
        return gated_ffn(h, lw, ops, "swiglu", i)
    if not cfg.n_ff_shexp:
        return moe_ffn(h, lw, cfg, ops, i)
    if "ffn_gate_inp_shexp" not in lw:
        return tap("ffn_out", i, moe_ffn(h, lw, cfg, ops, i) + gated_ffn(h, lw, ops, "swiglu", i, part="_shexp"))
    return tap("ffn_out", i, moe_ffn(h, lw, cfg, ops, i) + shared_expert(h, lw, ops, i))


def add_residual(x, h, cfg):  # [T, D], [T, D] -> x + h, h scaled first where the model scales it (Granite's)
    return x + h if cfg.residual_scale == 1.0 else x + h * array_module(h).float32(cfg.residual_scale)


def pre_norm_block(x, lw, cfg, ops, i, at, last_only=False):  # [T, D] -> [T, D] ([1, D]: last_only), layer i
    h = tap("attn_norm", i, ops.rms_norm(x, lw["attn_norm"], cfg.rms_eps))  # [T, D]
    q, k, v = qkv(h, lw, cfg, i)  # [T, H, HD], [T, KVH, HD], [T, KVH, HD]
    if "attn_q_norm" in lw:  # Qwen3, OLMoE
        q, k = qk_norm(q, k, lw, cfg, ops, i)
    if not cfg.is_nope(i):  # SmolLM3's NoPE layers: q and k unrotated
        q, k = rope_qk(q, k, cfg, ops, at, i)
    h = attend(q, k, v, lw, cfg, ops, i, at)  # [T, D]
    if last_only:  # only the last row goes on
        x, h = x[-1:], h[-1:]  # [1, D]
    x = tap("ffn_inp", i, add_residual(x, h, cfg))  # [T, D]
    del h, q, k, v  # before the feed-forward's larger arrays
    h = tap("ffn_norm", i, ops.rms_norm(x, lw["ffn_norm"], cfg.rms_eps))  # [T, D]
    h = feed_forward(h, lw, cfg, ops, i)  # [T, D]
    return tap("l_out", i, add_residual(x, h, cfg))  # [T, D]


def sandwich_block(x, lw, cfg, ops, i, at, last_only=False):  # [T, D] -> [T, D] ([1, D]: last_only), layer i
    """Gemma's block: a norm before and after attention and before and after the GeGLU feed-forward, each residual
    adding the post-normed output (`sa_out`, `l_out`); q and k normed per head where the layer has the norms (Gemma 3),
    the scores soft-capped where the model caps them (Gemma 2)."""
    eps = cfg.rms_eps
    h = tap("attn_norm", i, ops.rms_norm(x, lw["attn_norm"], eps))  # [T, D]
    q, k, v = qkv(h, lw, cfg, i)  # [T, H, HD], [T, KVH, HD], [T, KVH, HD]
    if "attn_q_norm" in lw:  # Gemma 3
        q, k = qk_norm(q, k, lw, cfg, ops, i)
    q, k = rope_qk(q, k, cfg, ops, at, i)
    h = attend(q, k, v, lw, cfg, ops, i, at)  # [T, D]
    del q, k, v  # before the feed-forward's larger arrays
    if last_only:  # only the last row goes on
        x, h = x[-1:], h[-1:]  # [1, D]
    h = tap("attn_post_norm", i, ops.rms_norm(h, lw["attn_post_norm"], eps))
    x = tap("sa_out", i, x + h)  # the attention residual

    h = tap("ffn_norm", i, ops.rms_norm(x, lw["ffn_norm"], eps))  # [T, D]
    h = gated_ffn(h, lw, ops, "geglu", i)  # [T, D]
    h = tap("ffn_post_norm", i, ops.rms_norm(h, lw["ffn_post_norm"], eps))
    return tap("l_out", i, x + h)
