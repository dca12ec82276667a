"""The porting bugs the harness's hints name, each as a function that injects it into a correct dump: given
refllama's own dump of a tiny model, it returns the records an engine with that one bug would have written differently
(just the first wrong stage: the hint reads that stage and its inputs). The registry (diagnose.HINTS) names a bug
for every hint, and tests/test_hints.py holds each hint to firing, alone, on its bug. A bug returns None where the
model cannot hold it (a tied output head has no untied one to confuse).
"""

import shutil
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .. import arch as archs
from ..layers import ROPE, causal_conv, linear, rms_norm, rope_cos_sin, silu, sink_softmax, softcap, softmax, softplus
from ..pairs import reorder_v_heads
from ..xp import to_numpy
from .dump import Dump
from .rerun import ROUND


class Correct(NamedTuple):
    """A correct dump to break (a directory refllama.api.Model.dump wrote) and the model that wrote it."""

    directory: Path
    model: object  # refllama.api.Model
    dump: Dump  # its manifest, read once

    def __getitem__(self, record):  # "Qcur-0" (the prefill) or "Qcur-0@9" (a decode step) -> its array
        return np.load(self.directory / f"{record}.npy")

    def __contains__(self, record):
        return (self.directory / f"{record}.npy").exists()

    @property
    def cfg(self):
        return self.model.config

    @property
    def n(self):  # the prefill's tokens
        return len(self.dump.prompt_ids)

    @property
    def decodes(self):  # whether the dump holds a decode step (at position n)
        return bool(self.dump.decode_ids)

    def weights(self, layer=None):  # the model's weights as NumPy arrays (a layer's, or the model's)
        w = self.model.weights if layer is None else self.model.weights["layers"][layer]
        return {k: (v if isinstance(v, list) else to_numpy(v)) for k, v in w.items() if k != "layers"}

    def rope_input(self, layer):  # the stage RoPE rotates: q after its norm where the family has one
        return archs.wiring(archs.get(self.cfg.arch))["Qcur_rope"].reads[0]

    def tables(self, local=False, shift=0):  # the cache's cos, sin at the prefill's positions (+ shift)
        cache = self.model.cache
        cos, sin = (cache.cos_swa, cache.sin_swa) if local and self.cfg.rope_base_swa else (cache.cos, cache.sin)
        at = np.arange(self.n) + shift
        return to_numpy(cos)[at], to_numpy(sin)[at]

    def block_input(self, layer):  # the residual stream entering block `layer`
        return archs.block_input(archs.get(self.cfg.arch).INPUTS, layer)

    def attend(self, kq, layer, shift=0, window="model", cap="model", sinks="model"):  # -> [H, T, S] the model's
        """softmax of kq over keys up to the query's own (`shift` past it), inside `window` (default: the layer's),
        soft-capped with `cap` (default: the model's attention cap), a sink logit a head in the denominator
        (default: the layer's, where it has them)."""
        cfg = self.cfg
        window = (cfg.sliding_window if cfg.is_windowed(layer) else None) if window == "model" else window
        cap = cfg.attn_softcap if cap == "model" else cap
        sinks = self.weights(layer).get("attn_sinks") if isinstance(sinks, str) else sinks
        gap = np.arange(kq.shape[1])[:, None] - np.arange(kq.shape[2])[None, :]
        seen = (gap >= -shift) & (True if window is None else gap < window)
        s = kq.astype(np.float64) * cfg.kq_scale
        s = np.where(seen, cap * np.tanh(s / cap) if cap else s, -np.inf)
        return (softmax(s) if sinks is None else sink_softmax(s, sinks)).astype(np.float32)

    def kv(self):  # query head h's kv head
        return np.arange(self.cfg.n_head) // (self.cfg.n_head // self.cfg.n_head_kv)


def inject(bug, directory, out, model):
    """A copy of the correct dump `directory` at `out` with `bug`'s records written; None where the model cannot
    hold the bug. -> the names of the records it changed."""
    records = bug(Correct(Path(directory), model, Dump(directory)))
    if records is None:
        return None
    shutil.copytree(directory, out)
    for record, a in records.items():
        old = np.load(Path(directory) / f"{record}.npy")
        assert a.shape == old.shape, (record, a.shape, old.shape)
        np.save(Path(out) / f"{record}.npy", a.astype(old.dtype))
    return list(records)


def _q_k(d, layer, q="Qcur_rope", k="Kcur_rope", kv=None):  # -> [H, T, S] unscaled q . k of two stages
    keys = d[f"{k}-{layer}"]
    return np.einsum("thd,shd->hts", d[f"{q}-{layer}"], keys[:, d.kv() if kv is None else kv])


# attention


def rope_not_skipped_on_nope_layers(d):  # SmolLM3's NoPE layer rotated
    layer = next((i for i in range(d.cfg.n_layer) if d.cfg.is_nope(i)), None)
    if layer is None:
        return None
    cos, sin = d.tables()
    rope = ROPE[d.cfg.rope_layout]
    q, k = rope(d[f"Qcur-{layer}"], cos, sin), rope(d[f"Kcur-{layer}"], cos, sin)
    return {f"kq-{layer}": np.einsum("thd,shd->hts", q, k[:, d.kv()])}


def attention_not_soft_capped(d):  # Gemma 2's scores without their cap
    return {"kq_scaled_2-0": d["kq-0"] * np.float32(d.cfg.kq_scale)} if d.cfg.attn_softcap else None


def rope_positions_from_1(d):
    layer = next(i for i in range(d.cfg.n_layer) if not d.cfg.is_nope(i))
    cos, sin = d.tables(d.cfg.is_windowed(layer), shift=1)
    return {f"Qcur_rope-{layer}": ROPE[d.cfg.rope_layout](d[f"{d.rope_input(layer)}-{layer}"], cos, sin)}


def rope_local_base_for_global(d):  # Gemma 3's local layer rotated with the global base
    if not d.cfg.rope_base_swa or not d.cfg.is_windowed(0):
        return None
    cos, sin = d.tables(local=False)
    return {"Qcur_rope-0": ROPE[d.cfg.rope_layout](d[f"{d.rope_input(0)}-0"], cos, sin)}


def rope_on_the_wrong_pairs(d):  # (2i, 2i+1) where the layout pairs (i, i + R/2), or the reverse
    cos, sin = d.tables()
    other = next(x for x in archs.LAYOUTS if x != d.cfg.rope_layout)
    return {"Qcur_rope-0": ROPE[other](d[f"{d.rope_input(0)}-0"], cos, sin)}


def decode_step_position_plus_1(d):  # a decode step rotated at its position + 1
    if not d.decodes:
        return None
    p = d.n
    q = d[f"{d.rope_input(0)}-0@{p}"]
    cache = d.model.cache
    cos, sin = to_numpy(cache.cos)[[p + 1]], to_numpy(cache.sin)[[p + 1]]
    return {f"Qcur_rope-0@{p}": ROPE[d.cfg.rope_layout](q, cos, sin)}


def later_positions_off(d):  # every position but the first a little off (a position-dependent step)
    q = d["Qcur_rope-0"].copy()
    q[1:] *= np.float32(1.01)
    return {"Qcur_rope-0": q}


def manifest_names_the_other_layout(d):  # q/k dumped in the other pair layout than the manifest's qk_layout
    other = next(x for x in archs.LAYOUTS if x != d.cfg.rope_layout)
    names = [p.stem for p in d.directory.glob("*.npy") if p.stem.split("@")[0].rsplit("-", 1)[0] in archs.QK_STAGES]
    return {n: archs.permute_qk(d[n], other, d.cfg.rope_dim) for n in names}


def heads_permuted(d):
    return {"Qcur-0": d["Qcur-0"][:, ::-1]}


def q_norm_skipped(d):
    return {"Qcur_normed-0": d["Qcur-0"]} if "Qcur_normed-0" in d else None


def kv_heads_modulo(d):  # query head h reads kv head h % KVH
    H, KVH = d.cfg.n_head, d.cfg.n_head_kv
    return {"kq-0": _q_k(d, 0, kv=np.arange(H) % KVH)} if H != KVH else None


def kv_cache_in_float16(d):  # keys rounded to float16 in a cache the manifest does not declare
    keys = ROUND["float16"](d["Kcur_rope-0"])
    return {"kq-0": np.einsum("thd,shd->hts", d["Qcur_rope-0"], keys[:, d.kv()])}


def softmax_scale_1_over_hd(d):
    cfg = d.cfg
    scaled = d["kq-0"] * (1 / cfg.head_dim) / cfg.kq_scale  # attend() scales by the model's scale
    return None if cfg.attn_softcap else {"kq_soft_max-0": d.attend(scaled, 0)}


def window_not_applied(d):
    layer = next((i for i in range(d.cfg.n_layer) if d.cfg.is_windowed(i)), None)
    if layer is None or d.n <= d.cfg.sliding_window:
        return None
    return {f"kq_soft_max-{layer}": d.attend(d[f"kq-{layer}"], layer, window=None)}


def window_on_the_other_layers(d):  # the local and global layers swapped: the first layer computed as the other kind
    cfg = d.cfg
    if not cfg.sliding_window or cfg.swa_layers is None or d.n <= cfg.sliding_window:
        return None
    return {"kq_soft_max-0": d.attend(d["kq-0"], 0, window=None if cfg.is_windowed(0) else cfg.sliding_window)}


def sinks_missing(d):  # gpt-oss's softmax without its sink logits
    return {"kq_soft_max-0": d.attend(d["kq-0"], 0, sinks=None)} if "attn_sinks" in d.weights(0) else None


def sinks_in_the_numerator(d):  # exp(sink) added to every key's weight as well as to the denominator
    if "attn_sinks" not in d.weights(0):
        return None
    p = d.attend(d["kq-0"], 0)
    return {"kq_soft_max-0": np.where(p > 0, p + (1 - p.sum(axis=-1, keepdims=True)), 0)}


def mask_one_key_late(d):  # each query also sees the key after its own
    return {"kq_soft_max-0": d.attend(d["kq-0"], 0, shift=1)}


def no_causal_mask(d):
    return {"kq_soft_max-0": d.attend(d["kq-0"], 0, shift=d.n, window=None)}


# norms, residuals, projections


def norm_eps_wrong(d):
    x, w = d[d.block_input(0)], d.weights(0)["attn_norm"]
    return None if d.cfg.arch == "gpt2" else {"attn_norm-0": rms_norm(x, w, 1e-2)}


def ffn_norm_skipped(d):
    residual = "sa_out-0" if "sa_out-0" in d else "ffn_inp-0"
    return {"ffn_norm-0": d[residual]}


def attn_norm_with_neighbours_weight(d):
    if d.cfg.n_layer < 2 or d.cfg.arch == "gpt2":
        return None
    return {"attn_norm-0": rms_norm(d[d.block_input(0)], d.weights(1)["attn_norm"], d.cfg.rms_eps)}


def norm_weight_without_one(d):  # Gemma's (1 + w) norm computed with HF's w
    if not any(w.key == "attn_norm" and w.hf_add for w in archs.get(d.cfg.arch).LAYER_WEIGHTS):
        return None
    return {"attn_norm-0": rms_norm(d[d.block_input(0)], d.weights(0)["attn_norm"] - 1, d.cfg.rms_eps)}


def embeddings_unscaled(d):  # the first norm on inp_embd where the model scales the embeddings
    if "inp_scaled" not in archs.get(d.cfg.arch).INPUTS:
        return None
    return {"attn_norm-0": rms_norm(d["inp_embd"], d.weights(0)["attn_norm"], d.cfg.rms_eps)}


def post_norm_skipped(d):  # Gemma's attention output added without attn_post_norm
    if "attn_post_norm-0" not in d:
        return None
    residual = "sa_out-0" if "sa_out-0" in d else "ffn_inp-0"
    return {residual: d[d.block_input(0)] + d["attn_out-0"]}


def pre_norm_where_none(d):  # OLMo 2's q read from the RMS-normed residual, as a Llama-shaped port would
    if d.cfg.arch != "olmo2":
        return None
    x = rms_norm(d[d.block_input(0)], np.ones(d.cfg.n_embd, np.float32), d.cfg.rms_eps)
    return {"Qcur-0": linear(x, d.weights(0)["attn_q"]).reshape(d["Qcur-0"].shape)}


def residual_dropped(d):
    return None if "sa_out-0" in d else {"ffn_inp-0": d["attn_out-0"]}


def residual_multiplier_dropped(d):  # Granite's
    if d.cfg.residual_scale == 1.0:
        return None
    return {"ffn_inp-0": d[d.block_input(0)] + d["attn_out-0"]}


def position_embeddings_not_added(d):  # GPT-2's
    return {"inpL": d["inp_embd"]} if "pos_embd" in d else None


def bias_dropped(d):  # one vector off at every position: a bias dropped or added
    v = np.random.default_rng(0).standard_normal(d["ffn_up-0"].shape[-1]).astype(np.float32)
    return {"ffn_up-0": d["ffn_up-0"] + 0.1 * v} if "ffn_up-0" in d else None


def scaled(d):
    return {"attn_out-0": d["attn_out-0"] * np.float32(0.5)}


def signs_flipped(d):
    x = d["attn_out-0"].copy()
    x[:, ::3] *= -1
    return {"attn_out-0": x}


def gate_read_for_up(d):  # the two projections swapped: ffn_gate computed with ffn_up's weights
    return {"ffn_gate-0": d["ffn_up-0"]} if "ffn_gate-0" in d and "ffn_up-0" in d else None


def relu_for_silu(d):
    if "ffn_swiglu-0" not in d:
        return None
    return {"ffn_swiglu-0": np.maximum(d["ffn_gate-0"], 0) * d["ffn_up-0"]}


def rounded_to_bfloat16(d):
    return {"ffn_inp-0": ROUND["bfloat16"](d["ffn_inp-0"])} if "ffn_inp-0" in d else None


# output


def _head(d, name):  # result_norm times weight `name`, soft-capped where the model caps its logits
    logits = linear(d["result_norm"], to_numpy(d.model.weights[name]))
    return softcap(logits, d.cfg.logit_softcap) if d.cfg.logit_softcap else logits


def output_head_tied(d):  # the embedding table as the output head of an untied model
    w = d.model.weights
    if "result_norm" not in d or w.get("output") is None or w["output"] is w.get("token_embd"):
        return None
    return {"result_output": _head(d, "token_embd")}


def logits_not_soft_capped(d):
    if not d.cfg.logit_softcap or "result_norm" not in d:
        return None
    return {"result_output": linear(d["result_norm"], to_numpy(d.model.weights["output"]))}


# mixtures of experts


def expert_ids_plus_1(d):
    return {"ffn_moe_topk-0": (d["ffn_moe_topk-0"] + 1) % d.cfg.n_expert} if d.cfg.n_expert else None


def sigmoid_router(d):
    return {"ffn_moe_probs-0": 1 / (1 + np.exp(-d["ffn_moe_logits-0"]))} if d.cfg.n_expert else None


def weights_on_other_slots(d):  # each expert weighted by another slot's weight
    return {"ffn_moe_weights-0": np.roll(d["ffn_moe_weights-0"], 1, axis=1)} if d.cfg.n_expert else None


def router_reads_the_residual(d):  # the router fed ffn_inp, not ffn_norm
    if not d.cfg.n_expert:
        return None
    return {"ffn_moe_logits-0": linear(d["ffn_inp-0"], d.weights(0)["ffn_gate_inp"])}


def least_probable_experts(d):  # top-k from the wrong end
    if not d.cfg.n_expert:
        return None
    ids = np.argsort(d["ffn_moe_probs-0"], axis=1, kind="stable")[:, :d.cfg.n_expert_used]
    return {"ffn_moe_topk-0": ids}


def renormalised_where_kept(d):  # the K weights divided by their sum in a family that keeps them
    if not d.cfg.n_expert or d.cfg.expert_norm:
        return None
    w = d["ffn_moe_weights-0"]
    return {"ffn_moe_weighted-0": d["ffn_moe_down-0"] * (w / w.sum(axis=1, keepdims=True))[..., None]}


def decode_step_not_renormalised(d):  # the K weights renormalised in the prefill, not in a decode step
    if not d.cfg.n_expert or not d.cfg.expert_norm or not d.decodes:
        return None
    p = d.n
    return {f"ffn_moe_weights_norm-0@{p}": d[f"ffn_moe_weights-0@{p}"]}


def neighbour_experts(d):  # each chosen expert's gate made with expert id + 1's matrix
    if not d.cfg.n_expert:
        return None
    x, ids, mats = d["ffn_norm-0"], d["ffn_moe_topk-0"].astype(np.int64), d.weights(0)["ffn_gate_exps"]
    E = len(mats)
    return {"ffn_moe_gate-0": np.stack([np.stack([linear(x[t:t + 1], to_numpy(mats[(k + 1) % E]))[0] for k in row])
                                        for t, row in enumerate(ids)])}


def shared_gate_without_sigmoid(d):
    return {"ffn_shexp_gate-0": d["ffn_shexp_gate_inp-0"]} if "ffn_shexp_gate-0" in d else None


def shared_expert_left_out(d):
    return {"ffn_out-0": d["ffn_moe_out-0"]} if "ffn_shexp_out-0" in d else None



# more forms of the bugs a hint names


def rope_base_wrong(d):  # another base than the model's (no scaling or factors in play)
    cfg = d.cfg
    if cfg.rope_yarn or cfg.rope_scale != 1 or cfg.rope_base_swa or not cfg.rope_dim or "rope_freqs" in d.model.weights:
        return None
    base = 5e5 if cfg.rope_base != 5e5 else 1e6
    cos, sin = rope_cos_sin(d.n, cfg.rope_dim, base)
    return {"Qcur_rope-0": ROPE[cfg.rope_layout](d[f"{d.rope_input(0)}-0"], cos, sin)}


def window_one_key_wide(d):
    layer = next((i for i in range(d.cfg.n_layer) if d.cfg.is_windowed(i)), None)
    if layer is None or d.n <= d.cfg.sliding_window + 1:
        return None
    return {f"kq_soft_max-{layer}": d.attend(d[f"kq-{layer}"], layer, window=d.cfg.sliding_window + 1)}


def q_k_rows_in_the_other_layout(d):  # q/k weights' rows in the other layout than the engine's RoPE pairs
    cfg = d.cfg
    if "Qcur_normed-0" in d or not cfg.rope_dim or cfg.is_nope(0):
        return None
    other = next(x for x in archs.LAYOUTS if x != cfg.rope_layout)
    cos, sin = d.tables(cfg.is_windowed(0))
    q, k = (archs.permute_qk(d[f"{n}-0"], other, cfg.rope_dim) for n in ("Qcur", "Kcur"))
    q_rope, k_rope = (ROPE[cfg.rope_layout](x, cos, sin) for x in (q, k))
    return {"Qcur-0": q, "Kcur-0": k, "Qcur_rope-0": q_rope, "Kcur_rope-0": k_rope,
            "kq-0": np.einsum("thd,shd->hts", q_rope, k_rope[:, d.kv()])}


def embedding_multiplier_dropped(d):  # Granite's stream starting from the unscaled embeddings
    cfg = d.cfg
    if cfg.arch != "granite" or cfg.embedding_scale in (None, 1.0):
        return None
    return {"ffn_inp-0": d["inp_embd"] + d["attn_out-0"] * np.float32(cfg.residual_scale)}


def logits_not_scaled(d):  # Granite's logits not divided by logits_scaling
    if d.cfg.arch != "granite" or d.cfg.logit_scale == 1.0:
        return None
    return {"result_output": linear(d["result_norm"], to_numpy(d.model.weights["output"]))}


def position_rows_plus_1(d):  # GPT-2's position rows taken at p + 1
    if "pos_embd" not in d:
        return None
    rows = to_numpy(d.model.weights["position_embd"])
    return {"pos_embd": rows[np.arange(d.n) + 1]}


def soft_cap_before_scale(d):  # Gemma 2's cap applied to the unscaled scores
    cap = d.cfg.attn_softcap
    if not cap:
        return None
    return {"kq_scaled_2-0": cap * np.tanh(d["kq-0"] / np.float32(cap)) * np.float32(d.cfg.kq_scale)}


def shared_expert_ungated(d):
    if "ffn_shexp_out-0" not in d:
        return None
    return {"ffn_out-0": d["ffn_moe_out-0"] + d["ffn_shexp-0"]}


def k_norm_over_the_whole_row(d):  # a per-head norm taken over all heads at once
    if "Kcur_normed-0" not in d or archs.get(d.cfg.arch).NAME == "olmoe":  # OLMoE's norm is over the whole row
        return None
    k, w = d["Kcur-0"], d.weights(0)["attn_k_norm"]
    return {"Kcur_normed-0": rms_norm(k.reshape(len(k), -1), np.tile(w, k.shape[1]), d.cfg.rms_eps).reshape(k.shape)}


def norm_weight_not_applied(d):
    if d.cfg.arch == "gpt2":
        return None
    residual = "sa_out-0" if "sa_out-0" in d else "ffn_inp-0"
    return {"ffn_norm-0": rms_norm(d[residual], np.ones(d.cfg.n_embd, np.float32), d.cfg.rms_eps)}


def attention_output_not_added(d):  # the stream alone: the attention's output left out
    return None if "sa_out-0" in d else {"ffn_inp-0": d[d.block_input(0)]}


def one_token_routed_elsewhere(d):  # one token's least weighted expert swapped for one not chosen
    if not d.cfg.n_expert:
        return None
    ids = d["ffn_moe_topk-0"].copy()
    ids[0, -1] = next(e for e in range(d.cfg.n_expert) if e not in ids[0])
    return {"ffn_moe_topk-0": ids}


# the hybrids' linear attention (Gated DeltaNet) and gated attention


def _oai(d):  # gpt-oss's mixture (its router softmaxes the K chosen logits)
    return d.cfg.expert_gating == "softmax_weight"


def router_bias_missing(d):
    return {"ffn_moe_probs-0": d["ffn_moe_logits-0"]} if _oai(d) else None


def softmax_over_every_expert(d):  # Mixtral's router on gpt-oss's biased logits
    return {"ffn_moe_probs-0": softmax(d["ffn_moe_probs-0"])} if _oai(d) else None


def _oai_unit(d, alpha=None, clamp=True):  # gpt-oss's unit on layer 0's biased gate and up
    a, limit = d.cfg.oai_swiglu
    x, y = d["ffn_moe_gate_biased-0"], d["ffn_moe_up_biased-0"]
    g, u = (np.minimum(x, limit), np.clip(y, -limit, limit)) if clamp else (x, y)
    return {"ffn_moe_swiglu_oai-0": g / (1 + np.exp(-(alpha or a) * g)) * (u + 1)}


def swiglu_clamp_missing(d):
    return _oai_unit(d, clamp=False) if d.cfg.oai_swiglu else None


def swiglu_alpha_1(d):  # SiLU's sigmoid(x) where the unit takes sigmoid(1.702 x)
    return _oai_unit(d, alpha=1.0) if d.cfg.oai_swiglu else None


def expert_biases_missing(d):
    return {"ffn_moe_gate_biased-0": d["ffn_moe_gate-0"]} if "ffn_moe_gate_biased-0" in d else None


def experts_dumped_biased(d):  # an engine whose expert product adds its bias, dumped under the product's name
    return {"ffn_moe_gate-0": d["ffn_moe_gate_biased-0"]} if "ffn_moe_gate_biased-0" in d else None


def _linear_layer(d):  # the first linear-attention layer, or None
    return next((i for i in range(d.cfg.n_layer) if d.cfg.is_recurrent(i)), None)


def _weight(d, layer, key):  # a layer's weight (a vector, a conv's taps) as a float32 NumPy array
    return to_numpy(d.model.weights["layers"][layer][key]).astype(np.float32)


def decay_from_a_log_as_stored(d):  # HF's A_log used as the decay's factor, not -exp(A_log)
    L = _linear_layer(d)
    if L is None:
        return None
    return {f"gate-{L}": d[f"a_softplus-{L}"] * np.log(-_weight(d, L, "ssm_a"))}


def dt_bias_missing(d):  # softplus(alpha) without dt_bias
    L = _linear_layer(d)
    if L is None:
        return None
    return {f"a_softplus-{L}": softplus(d[f"alpha-{L}" if f"alpha-{L}" in d else f"a-{L}"])}


def conv_state_not_carried(d):  # a decode step's conv from zeros: the prefill's last inputs forgotten
    L = _linear_layer(d)
    if L is None or not d.decodes:
        return None
    return {f"conv_output_raw-{L}@{d.n}": d[f"linear_attn_qkv_mixed-{L}@{d.n}"] * _weight(d, L, "ssm_conv1d")[:, -1]}


def conv_kernel_reversed(d):  # the conv's taps in the other order (a cross-correlation read as a convolution)
    L = _linear_layer(d)
    if L is None:
        return None
    x, w = d[f"linear_attn_qkv_mixed-{L}"], _weight(d, L, "ssm_conv1d")
    return {f"conv_output_raw-{L}": causal_conv(x, np.zeros((w.shape[1] - 1, w.shape[0]), np.float32), w[:, ::-1])[0]}


def qk_not_l2_normed(d):  # q as the conv gave it to the delta rule
    L = _linear_layer(d)
    if L is None:
        return None
    q = d[f"q_conv-{L}"]
    if d.cfg.linear_v_order == "grouped":  # its graph names q after the repeat to the v heads
        q = np.repeat(q, d.cfg.linear_v_heads // d.cfg.linear_k_heads, axis=1)
    return {f"q_conv_predelta-{L}": q}


def gated_norm_in_the_other_order(d):  # rms_norm(o silu(z)) w: the gate before the norm (Mamba-2's order)
    L = _linear_layer(d)
    if L is None:
        return None
    o, z = d[f"attn_output-{L}"], d[f"z-{L}"].reshape(d[f"attn_output-{L}"].shape)
    return {f"final_output-{L}": rms_norm(o * silu(z), _weight(d, L, "ssm_norm"), d.cfg.rms_eps).reshape(len(o), -1)}


def v_heads_in_the_other_order(d):  # HF's grouped v heads where the model's are tiled (or the reverse)
    L, cfg = _linear_layer(d), d.cfg
    if L is None or cfg.linear_v_heads == cfg.linear_k_heads:
        return None
    other = "grouped" if cfg.linear_v_order == "tiled" else "tiled"
    x = d[f"linear_attn_qkv_mixed-{L}"]
    return {f"linear_attn_qkv_mixed-{L}": reorder_v_heads("linear_attn_qkv_mixed", x, cfg.linear_k_heads,
                                                          cfg.linear_v_heads, to=other)}


def beta_without_sigmoid(d):  # beta as its projection gave it
    L = _linear_layer(d)
    if L is None or f"beta-{L}" not in d:
        return None
    return {f"beta_sigmoid-{L}": d[f"beta-{L}"]}


def attention_output_gate_missing(d):  # the gated attention's output not multiplied by sigmoid(gate)
    A = next((i for i in range(d.cfg.n_layer) if f"attn_pregate-{i}" in d), None)
    return None if A is None else {f"attn_gated-{A}": d[f"attn_pregate-{A}"]}


def rope_over_every_dim(d):  # RoPE over a head's every dim where the model rotates only its first rope_dim
    cfg = d.cfg
    if cfg.rope_dim >= cfg.head_dim or cfg.rope_dim == 0:
        return None
    A = next(i for i in range(cfg.n_layer) if not cfg.is_recurrent(i) and not cfg.is_nope(i))
    cos, sin = rope_cos_sin(d.n, cfg.head_dim, cfg.rope_base)
    return {f"Qcur_rope-{A}": ROPE[cfg.rope_layout](d[f"{d.rope_input(A)}-{A}"], cos, sin)}


# DeepSeek-V3's routing (GLM-4.5's too) and its latent attention


def _scored(d):  # -> the first layer with experts where the router scores by sigmoids (DeepSeek's), or None
    if d.cfg.expert_gating != "sigmoid":
        return None
    return next(i for i in range(d.cfg.n_layer) if d.cfg.is_moe(i))


def _top_k(scores, k):  # [T, E] -> [T, K] float ids, the largest first (ties to the lower id)
    return np.argsort(-scores, axis=1, kind="stable")[:, :k].astype(np.float32)


def softmax_for_sigmoid(d):  # the router's scores a softmax over the experts where the file says sigmoid
    L = _scored(d)
    return None if L is None else {f"ffn_moe_probs-{L}": softmax(d[f"ffn_moe_logits-{L}"])}


def selection_bias_on_the_weights(d):  # the experts weighed by their biased scores
    L = _scored(d)
    if L is None or not d.cfg.expert_bias:
        return None
    ids = d[f"ffn_moe_topk-{L}"].astype(np.int64)
    return {f"ffn_moe_weights-{L}": np.take_along_axis(d[f"ffn_moe_probs_biased-{L}"], ids, axis=1)}


def selection_bias_not_chosen_by(d):  # the experts chosen by the unbiased scores (the bias left out)
    L = _scored(d)
    if L is None or not d.cfg.expert_bias or d.cfg.expert_groups > 1:
        return None
    ids = _top_k(d[f"ffn_moe_probs-{L}"], d.cfg.n_expert_used)
    return None if np.array_equal(np.sort(ids, 1), np.sort(d[f"ffn_moe_topk-{L}"], 1)) else {f"ffn_moe_topk-{L}": ids}


def expert_groups_ignored(d):  # the top K of every expert, where the model chooses within its best groups
    L = _scored(d)
    if L is None or d.cfg.expert_groups == 1:
        return None
    ids = _top_k(d[f"ffn_moe_probs_biased-{L}"], d.cfg.n_expert_used)
    return None if np.array_equal(np.sort(ids, 1), np.sort(d[f"ffn_moe_topk-{L}"], 1)) else {f"ffn_moe_topk-{L}": ids}


def routed_scaling_dropped(d):  # the weights not scaled by routed_scaling_factor
    L = _scored(d)
    if L is None or d.cfg.expert_scale == 1.0:
        return None
    return {f"ffn_moe_weights_scaled-{L}": d[f"ffn_moe_weights_scaled-{L}"] / np.float32(d.cfg.expert_scale)}


def shared_experts_left_out(d):  # DeepSeek's ungated shared experts not added
    L = next((i for i in range(d.cfg.n_layer) if f"ffn_shexp-{i}" in d and f"ffn_shexp_out-{i}" not in d), None)
    return None if L is None else {f"ffn_out-{L}": d[f"ffn_moe_out-{L}"]}


def dense_layer_routed(d):  # a dense lead layer's feed-forward computed as the next layer's mixture of experts
    cfg = d.cfg
    if not cfg.n_expert or cfg.is_moe(0):
        return None
    from ..arch import blocks  # the forward's own pieces, in float32

    L = next(i for i in range(cfg.n_layer) if cfg.is_moe(i))
    return {"ffn_out-0": to_numpy(blocks.feed_forward(d["ffn_norm-0"], d.model.weights["layers"][L], cfg, d.model.ops,
                                                      L))}


def _latent(d):  # the model's latent attention: (NOPE, KL) or None
    return (d.cfg.head_dim - d.cfg.rope_dim, d.cfg.kv_lora_rank) if d.cfg.kv_lora_rank else None


def q_pe_in_the_other_pairs(d):  # q_pe rotated in the other pair layout
    if not _latent(d):
        return None
    cos, sin = d.tables()
    other = next(x for x in archs.LAYOUTS if x != d.cfg.rope_layout)
    return {"q_pe-0": ROPE[other](d["q-0"][..., _latent(d)[0]:], cos, sin)}


def k_pe_from_the_latents_dims(d):  # k_pe rotated from the projection's first R dims (the latent's) for its last R
    if not _latent(d):
        return None
    cos, sin = d.tables()
    return {"k_pe-0": ROPE[d.cfg.rope_layout](d["kv_cmpr_pe-0"][:, None, :d.cfg.rope_dim], cos, sin)}


def softmax_scale_without_mscale(d):  # 1/sqrt(HD) where DeepSeek's YaRN puts its mscale squared in the scale
    cfg = d.cfg
    if not cfg.rope_mscale_in_kq:
        return None
    return {"kq_soft_max-0": d.attend(d["kq-0"] * np.float32(1 / np.sqrt(cfg.head_dim) / cfg.kq_scale), 0)}
