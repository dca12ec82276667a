"""Where the first diverging stage's error sits (by position, head, channel) and what it looks like: one detector a
usual porting bug (a scale factor, the other RoPE pair layout, another activation, eps or softmax scale, ...)."""

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .. import arch as archs
from ..arch.blocks import IN, RESIDUAL, WIRING, block_input
from ..layers import (
    ROPE,
    causal_conv,
    embedding,
    linear,
    rms_norm,
    silu,
    sink_softmax,
    softplus,
    yarn_dims,
    yarn_mscale,
)
from ..pairs import V_HEAD_STAGES, reorder_v_heads
from ..xp import to_numpy
from . import bugs
from .dump import INPUT_STAGES, Dump, split_name
from .metrics import ATTENTION, SLOT_STAGES, metrics, spans, take, visible
from .rerun import ROUND, Forced
from .tolerances import rounding_bands


def diagnose(report, mine, ref, forced, model):
    """Fill report.where and report.hints for the first divergence: the side that adds error against refllama's
    re-run of that stage on the same inputs, or MINE against REF when nothing could be re-run."""
    r = report.first
    name, stage, layer = r["name"], r["stage"], r["layer"]
    side = r["adds"][0] if r["adds"] else None
    bad_dump = ref if side == "REF" else mine
    good = forced[side] if side else ref
    positions = [p for p in bad_dump.positions(name) if p in set(good.positions(name))]
    bad, want = take(bad_dump, name, positions), take(good, name, positions, slots=bad_dump if side else None)
    tol = report.column.local(stage) if side else report.column.e2e(stage)
    cfg = model.config if model else None
    against = f"refllama re-run on {side}'s inputs" if side else "REF"
    report.where.append(f"{side or 'MINE'} against {against}:")
    ids = _stages(good, [f"ffn_moe_topk-{layer}"], positions) if stage in ROUTED else None
    lines, wrong = breakdown(stage, positions, bad, want, tol, cfg, None if ids is None else np.sort(ids[0], axis=1))
    report.where.extend(lines)
    r["wrong_positions"] = wrong  # the first-divergence line names the positions this breakdown finds wrong
    found = hints(stage, layer, positions, bad, want, tol, bad_dump, good, model, ref)
    report.hints.extend(line for _, line in found)
    report.hinted.extend(name for name, _ in found)


def _error_by(diff, scale, axis):
    """Mean squared error of each slice along `axis`, over `scale` (the whole reference's mean square)."""
    other = tuple(i for i in range(diff.ndim) if i != axis)
    return np.nanmean(diff ** 2, axis=other) / scale


ROUTED = SLOT_STAGES  # [T, K, ...]: a token's experts


def breakdown(stage, positions, bad, want, tol, cfg, ids=None):
    """Lines: which positions, heads (a routed stage: chosen experts, and with `ids`, [T, K] the experts' ids in the
    values' order, expert ids) and channels are wrong; and the wrong positions."""
    valid = visible(stage, positions, want.shape)
    diff = np.where(True if valid is None else valid, bad.astype(np.float64) - want, np.nan)
    scale = float(np.nanmean(np.where(True if valid is None else valid, want.astype(np.float64), np.nan) ** 2)) or 1.0
    exact = tol[1] if tol else 1e-8
    lines = []

    def split(label, errors, names):
        ok = [names[i] for i, e in enumerate(errors) if e <= exact]
        wrong = [names[i] for i, e in enumerate(errors) if not e <= exact]
        if ok and wrong:
            lines.append(f"  by {label}: exact at {spans(ok)}; wrong at {spans(wrong)}")
        elif wrong:
            lines.append(f"  by {label}: wrong at every one ({len(wrong)})")
        return ok, wrong

    _, wrong = split("position", _error_by(diff, scale, Dump.axis_of(stage)), positions)
    if stage in ROUTED and diff.ndim >= 2:  # slot k: a token's k-th chosen expert in id order (as compare takes them)
        split("chosen expert (in id order)", _error_by(diff, scale, 1), list(range(diff.shape[1])))
        if ids is not None and ids.shape == diff.shape[:2]:
            experts = sorted({int(i) for i in ids.reshape(-1)})
            split("expert id", [float(np.nanmean(diff[ids == x] ** 2)) / scale for x in experts], experts)
        if diff.ndim == 2:
            return lines, wrong
    heads = None if stage in ROUTED else _heads(stage, diff, cfg)
    if heads is not None:
        axis = 0 if stage in ATTENTION else 1
        n = heads.shape[axis]
        split("head", _error_by(heads, scale, axis), list(range(n)))
    if diff.ndim == 2 or (diff.ndim == 3 and stage not in ATTENTION):  # [T, X], or [T, n, HD] by dim of a head
        per = np.nansum(diff ** 2, axis=tuple(range(diff.ndim - 1)))
        total = float(per.sum()) or 1.0
        top = np.argsort(per)[::-1][:8]
        share = float(per[top].sum()) / total
        label, many = ("channel", "channels") if diff.ndim == 2 or stage in ROUTED else ("dim of a head",
                                                                                         "dims of a head")
        if share > 0.5 and len(per) > 16:
            lines.append(f"  by {label}: {share:.0%} of the error in {many} {', '.join(map(str, sorted(top)))} "
                         f"of {len(per)}")
        else:
            lines.append(f"  by {label}: spread over the {len(per)} {many}")
    return lines, wrong


def _heads(stage, a, cfg):
    """The stage with a head axis ([T, n, HD] or [H, T, S]; kqv_out split into heads), or None."""
    if a.ndim == 3:
        return a
    if stage == "kqv_out" and cfg is not None:
        return a.reshape(a.shape[0], -1, cfg.head_dim)
    return None


class Evidence(NamedTuple):
    """What the hint detectors look at: the first diverging stage as the side that adds error has it (`bad`) and as
    it should be (`want`), at `positions`; `valid` marks the entries compared, `close` says whether two arrays are
    equal to the column's tolerance."""

    stage: str
    layer: int | None
    positions: list
    bad: np.ndarray
    want: np.ndarray
    valid: np.ndarray  # bool, want's shape
    b: np.ndarray  # bad's compared entries, float64
    w: np.ndarray  # want's
    exact: float  # the column's nmse tolerance
    cfg: object  # ModelConfig or None
    model: object  # refllama.api.Model or None
    bad_dump: object
    good: object  # the dump (or re-run) holding the expected values
    ref: object  # REF's dump

    def close(self, x, y):
        return metrics(x, y)["nmse"] <= self.exact

    def inputs(self):  # the side's own inputs of the stage, or REF's where it dumps none (upstream: equal within the
        # tolerance, or an earlier stage would have diverged first)
        return (_inputs_of(self.stage, self.layer, self.bad_dump, self.positions, self.cfg)
                or _inputs_of(self.stage, self.layer, self.ref, self.positions, self.cfg))


def scale_factor(e):
    if e.w.any():
        c = float(e.b @ e.w / (e.w @ e.w))
        if abs(c - 1) > 1e-3 and e.close(e.b, c * e.w):
            yield (f"hint: {c:.6g} x the expected values (1/{1 / c:.6g}): a scale factor"
                    + (" (a sign flip)" if abs(c + 1) < 1e-3 else ""))


def sign_flip(e):
    """Some of the values negated: checked by negating those in the expected values."""
    flips = ((np.sign(e.b) != np.sign(e.w)) & np.isclose(np.abs(e.b), np.abs(e.w), rtol=1e-3, atol=0)
             & (np.abs(e.w) > 1e-6 * np.abs(e.w).max())) if e.w.any() else np.zeros(0, bool)
    if 0.05 < np.mean(flips) and e.close(np.where(flips, -e.w, e.w), e.b):
        yield f"hint: {np.mean(flips):.0%} of the values have the expected magnitude and the opposite sign"


def other_pair_layout(e):
    """q/k in the other pair layout than the manifest's qk_layout says (the layout of the values dumped). Which of
    the two is wrong shows in the side's attention scores: right (kq within tolerance of REF's) where only the
    manifest misnames the layout, wrong where the engine's q/k weights' rows are in the other layout than its RoPE
    pairs (HF's RoPE on GGUF's rows, or the reverse: the classic unpermuted q/k)."""
    if e.stage not in archs.QK_STAGES or e.cfg is None:
        return
    other = _other_layout(e.cfg)
    # the reader applied the wrong one of the two reorderings (or none): either undoes it
    if not any(e.close(archs.permute_qk(e.bad, to, e.cfg.rope_dim), e.want) for to in archs.LAYOUTS):
        return
    kq = f"kq-{e.layer}"
    held = [p for p in e.positions if e.ref is not None and kq in e.ref and kq in e.bad_dump
            and p in set(e.ref.positions(kq)) & set(e.bad_dump.positions(kq))]
    if not held:
        yield (f"hint: equal after converting q/k to the '{other}' pair layout: the manifest's qk_layout (the layout "
               "of the values dumped) is wrong, or the engine's q/k weights' rows are in the other layout than its "
               f"RoPE pairs ({kq} is not in both dumps to tell which)")
        return
    mine, ref = take(e.bad_dump, kq, held), take(e.ref, kq, held)
    vis = visible("kq", held, ref.shape)
    declared = e.bad_dump.manifest.get("qk_layout", e.cfg.rope_layout)
    actual = next(x for x in archs.LAYOUTS if x != declared)
    tol = rounding_bands("float16")[1] if e.bad_dump.kv_cache == "float16" else e.exact  # its keys rounded
    if metrics(mine[vis], ref[vis])["nmse"] <= tol:
        yield (f"hint: equal after converting q/k to the other pair layout, and {kq} is right: the engine's q/k are "
               f"right, stored in the '{actual}' layout; the manifest's qk_layout (the layout of the values dumped) "
               f"should say '{actual}'")
    else:
        yield (f"hint: equal after converting q/k to the other pair layout, and {kq} is wrong: the engine's "
               f"attn_q/attn_k rows are in the '{actual}' layout where its RoPE pairs '{declared}' (GGUF's rows not "
               "unpermuted for HF-style RoPE, or the reverse), so its RoPE rotates the wrong pairs")


def permuted_heads(e):
    heads = _heads(e.stage, e.bad, e.cfg)
    if heads is not None and e.stage not in ATTENTION:
        wh = _heads(e.stage, e.want, e.cfg)
        n = heads.shape[1]
        match = [next((g for g in range(n) if e.close(heads[:, h], wh[:, g])), None) for h in range(n)]
        if None not in match and match != list(range(n)):
            yield f"hint: equal up to a permutation of heads: head h holds the expected head {match}[h]"


def another_stage(e):
    if e.layer is None or e.good is None:
        return
    for name in e.good.names:
        stage, layer = split_name(name)
        if layer == e.layer and stage != e.stage and set(e.positions) <= set(e.good.positions(name)):
            o = take(e.good, name, e.positions, slots=e.bad_dump)
            if o.shape == e.bad.shape and e.close(e.bad, o):
                yield f"hint: equals the expected {name}: the two are swapped, or read from one another's weights"


def another_kv_head_mapping(e):
    """Query head h read kv head h % KVH where grouped-query attention pairs it with kv head h // (H / KVH): re-run
    as MINE's q times its keys with that mapping."""
    if e.stage != "kq" or e.cfg is None or e.cfg.n_head == e.cfg.n_head_kv or e.layer is None:
        return
    H, KVH = e.cfg.n_head, e.cfg.n_head_kv
    kq = _scores(e, np.arange(H) % KVH)
    if kq is not None and e.close(kq[e.valid], e.b):
        yield (f"hint: matches query head h read with kv head h % {KVH}: grouped-query attention pairs it with "
               f"kv head h // {H // KVH}")


def _scores(e, kv, cache=None):  # -> the side's q . k [H, T, S], query head h with kv head kv[h], or None
    """Its keys as its KV cache keeps them (`cache`: that type instead of the side's declared one)."""
    keys = _stages(e.bad_dump, [f"Kcur_rope-{e.layer}"], list(range(max(e.positions) + 1)))
    queries = _stages(e.bad_dump, [f"Qcur_rope-{e.layer}"], e.positions)
    if not keys or not queries:
        return None
    k = keys[0].astype(np.float32)
    cache = cache or getattr(e.bad_dump, "kv_cache", None)
    k = ROUND[cache](k) if cache in ROUND else k
    return np.einsum("thd,shd->hts", queries[0], k[:, kv].astype(np.float64))


def float16_cache(e):
    """kq from keys, or kqv_out from values, rounded to float16: a float16 KV cache the manifest does not declare
    (whichever shows first past the bands)."""
    if e.stage not in ("kq", "kqv_out") or e.cfg is None or e.layer is None \
            or e.bad_dump.kv_cache == "float16" or e.bad_dump.numerics == "ggml":  # ggml's cache is float16
        return
    kv = np.arange(e.cfg.n_head) // (e.cfg.n_head // e.cfg.n_head_kv)
    if e.stage == "kq":
        value, valid, what = _scores(e, kv, "float16"), e.valid, "q . k with the keys"
    else:
        parts = (_stages(e.bad_dump, [f"kq_soft_max-{e.layer}"], e.positions),
                 _stages(e.bad_dump, [f"Vcur-{e.layer}"], list(range(max(e.positions) + 1))))
        value = None if None in parts else np.einsum(
            "hts,shd->thd", np.nan_to_num(parts[0][0]) * visible("kq_soft_max", e.positions, parts[0][0].shape),
            ROUND["float16"](parts[1][0].astype(np.float32))[:, kv]).reshape(len(e.positions), -1)
        valid, what = np.ones(e.want.shape, bool), "the weights times the values"
    if value is not None and e.close(value[valid], e.b):
        yield (f'hint: matches {what} rounded to float16: a float16 KV cache; declare it: "kv_cache": "float16" in '
               "the manifest (K and V are dumped before the cache rounds them)")


def another_activation(e):
    """Another activation where the unit's belongs (GELU's erf form for its tanh form, SiLU for GELU, ...), or a
    gated unit's gate and up swapped."""
    inputs = e.inputs() if e.stage in GATED else None
    if not inputs:
        return
    own = GATED[e.stage]
    forms = {f"{a}(ffn_up)": (ACTIVATIONS[a], inputs[0], 1.0) for a in ACTIVATIONS if a != own} if len(inputs) == 1 \
        else {**{f"{a}(ffn_gate) * ffn_up": (ACTIVATIONS[a], *inputs) for a in ACTIVATIONS if a != own},
              f"{own}(ffn_up) * ffn_gate": (ACTIVATIONS[own], inputs[1], inputs[0])}
    err = {label: metrics(f(x) * y, e.bad)["nmse"] for label, (f, x, y) in forms.items()}
    best = min(err, key=err.get)
    if err[best] <= e.exact:
        why = "ffn_gate and ffn_up swapped" if best.endswith("* ffn_gate") else f"the model's is {own}"
        yield f"hint: matches {best}; {why}"


def another_softmax_scale(e):
    """The scale that fits the weights (each row's log-weights against its scores), checked by re-running the softmax
    with it, and named where it is a usual one."""
    inputs = e.inputs() if e.stage == "kq_soft_max" and e.cfg is not None else None
    if not inputs:
        return
    (kq,) = inputs
    vis = visible(e.stage, e.positions, kq.shape)
    use = vis & (e.bad > 0) & np.isfinite(kq)
    x, y = np.where(use, kq, np.nan), np.where(use, np.log(np.where(use, e.bad, 1.0)), np.nan)
    dx, dy = x - np.nanmean(x, axis=-1, keepdims=True), y - np.nanmean(y, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        slopes = np.nansum(dx * dy, axis=-1) / np.nansum(dx * dx, axis=-1)  # per row: log p = s kq - log Z
    slopes = slopes[np.isfinite(slopes)]
    if not slopes.size:
        return
    s, scale = float(np.median(slopes)), e.cfg.kq_scale
    if abs(s / scale - 1) < 1e-3 or e.cfg.attn_softcap or not e.close(
            _attention(kq, s, vis, sinks=_sinks(e))[e.valid], e.b):
        return
    hd, d_h = e.cfg.head_dim, e.cfg.n_embd / e.cfg.n_head
    usual = {"1/sqrt(HD)": hd ** -0.5, "1/sqrt(D/H)": d_h ** -0.5, "1/HD": 1 / hd, "1 (no scale)": 1.0}
    name = next((f" = {k}" for k, v in usual.items() if abs(s / v - 1) < 1e-3), "")
    mscale = (f" (1/sqrt(HD) times YaRN's mscale squared, {scale * hd ** 0.5:.4g}: DeepSeek's mscale_all_dim, "
              "llama.cpp's yarn_log_multiplier)") if e.cfg.rope_mscale_in_kq else ""
    yield f"hint: matches softmax(kq * {s:.4g}{name}); the model's scale is {scale:.4g}{mscale}"


def another_norm_eps(e):
    inputs = e.inputs() if e.stage in ("attn_norm", "ffn_norm", "result_norm") and e.cfg is not None else None
    if inputs:
        (x,) = inputs
        ms = np.mean(x.astype(np.float64) ** 2, axis=-1)
        ratio = np.median(np.abs(e.want) / np.maximum(np.abs(e.bad), 1e-30), axis=-1) ** 2  # (ms + eps') / (ms + eps)
        eps = ratio * (ms + e.cfg.rms_eps) - ms
        fit = float(np.median(eps))
        rerun = e.want * np.sqrt((ms + e.cfg.rms_eps) / (ms + fit))[..., None]  # x w / sqrt(ms + eps')
        if np.all(np.abs(ratio - 1) > 1e-7) and fit > 0 and e.close(rerun, e.bad):  # no norm has a negative eps
            yield f"hint: matches an RMS norm with eps {fit:.3g}; the model's is {e.cfg.rms_eps:g}"


def rope_on_the_wrong_pairs(e):
    """RoPE rotating the other layout's pairs: on q/k kept in the model's order ((2i, 2i+1) where the model pairs
    (i, i + R/2), Qwen2's usual porting bug, or the reverse), or on q/k converted to the other order and back."""
    inputs = e.inputs() if e.stage in ("Qcur_rope", "Kcur_rope") and e.cfg is not None else None
    if inputs and e.model is not None:
        cfg, other = e.cfg, _other_layout(e.cfg)
        cos, sin = _rope_tables(e, e.cfg.is_windowed(e.layer))
        x = inputs[0].astype(np.float32)
        held_other = archs.permute_qk(x, other, cfg.rope_dim)  # q/k in the other order
        swapped = archs.permute_qk(ROPE[cfg.rope_layout](held_other, cos, sin), cfg.rope_layout, cfg.rope_dim)
        if e.close(ROPE[other](x, cos, sin), e.bad) or e.close(swapped, e.bad):
            yield ("hint: matches RoPE rotating the wrong pairs: (2i, 2i+1) where the q/k order pairs (i, i + R/2), "
                    "or the reverse; the engine's RoPE and its q/k layout disagree")


def swapped_rope_bases(e):
    """A local layer rotated with the global layers' RoPE base, or the reverse (Gemma 3's two bases): the bases
    swapped, or the pattern of local and global layers off."""
    inputs = e.inputs() if e.stage in ("Qcur_rope", "Kcur_rope") and e.cfg is not None else None
    if inputs and e.model is not None and e.cfg.rope_base_swa:
        local = e.cfg.is_windowed(e.layer)
        cos, sin = _rope_tables(e, not local)
        if e.close(ROPE[e.cfg.rope_layout](inputs[0].astype(np.float32), cos, sin), e.bad):
            yours, theirs = ("local", "global") if local else ("global", "local")
            base = e.cfg.rope_base if local else e.cfg.rope_base_swa
            yield (f"hint: matches RoPE with the {theirs} layers' base ({base:g}) on this {yours} layer: the two "
                   "bases swapped, or the pattern of local and global layers off")


def rope_frequencies(e):
    """RoPE at other angles: not applied, positions off by one, the frequency factors left out or LongRoPE's other
    set, the linear scale left out, another base (fitted from the rotation of the first positive position)."""
    inputs = e.inputs() if e.stage in ("Qcur_rope", "Kcur_rope") and e.cfg is not None else None
    if not inputs or e.model is None:
        return
    cfg, x = e.cfg, inputs[0].astype(np.float32)
    if e.close(x, e.bad):
        yield f"hint: equals its input ({'K' if e.stage[0] == 'K' else 'Q'}{_q_input(cfg)[1:]}): RoPE is not applied"
        return
    local = cfg.is_windowed(e.layer) and bool(cfg.rope_base_swa)
    base, scale = (cfg.rope_base_swa, 1.0) if local else (cfg.rope_base, cfg.rope_scale)
    w = e.model.weights
    ff = archs.freq_factors(w, cfg, e.model.n_ctx)
    ff = None if ff is None else to_numpy(ff).astype(np.float64)

    yarn = yarn_dims(cfg) if cfg.rope_yarn and not local else None

    def rope(base=base, scale=scale, ff=ff, shift=0, yarn=yarn, attn_factor=cfg.rope_attn_factor):
        cos, sin = e.model.ops.rope_cos_sin(max(e.positions) + 2, cfg.rope_dim, base, scale, attn_factor, ff, yarn)
        at = np.maximum(np.asarray(e.positions) + shift, 0)
        return ROPE[cfg.rope_layout](x, to_numpy(cos)[at], to_numpy(sin)[at])

    tries = {"matches RoPE at positions p + 1: the positions are off by one (counted from 1)": {"shift": 1},
             "matches RoPE at positions p - 1: the positions are off by one": {"shift": -1}}
    if ff is not None:
        if "rope_factors_long" in w:
            other = "short" if np.array_equal(ff, to_numpy(w["rope_factors_long"])) else "long"
            tries[f"matches RoPE with LongRoPE's {other} factors: the wrong set for a context of {e.model.n_ctx} "
                  f"(long ones above {cfg.rope_ctx_orig or cfg.n_ctx_train})"] = {
                "ff": to_numpy(w[f"rope_factors_{other}"]).astype(np.float64)}
        tries["matches RoPE without the model's frequency factors (rope_freqs or LongRoPE's): they divide each "
              "pair's frequency"] = {"ff": None}
    if yarn is not None:
        mscale = f"cos and sin times {cfg.rope_attn_factor * yarn_mscale(scale):.6g}"
        tries[f"matches RoPE with YaRN read as linear scaling (every frequency divided by {scale:g}, no "
              f"attention factor): YaRN divides only the low frequencies, and {mscale}"] = {
            "yarn": None, "attn_factor": 1.0}
        tries[f"matches RoPE with YaRN's frequencies but without its attention factor ({mscale})"] = {
            "attn_factor": 1.0 / yarn_mscale(scale)}
        tries["matches RoPE without YaRN (no scaling at all)"] = {"yarn": None, "scale": 1.0, "attn_factor": 1.0}
    elif scale != 1:
        tries[f"matches RoPE without the linear scaling (positions divided by {scale:g})"] = {"scale": 1.0}
    fit = None if yarn else _fitted_base(cfg, x, e.bad, e.positions, scale, ff)
    if fit is not None and abs(fit / base - 1) > 1e-3:
        tries[f"matches RoPE with base {fit:.6g}; the model's {'local ' if local else ''}base is {base:g}"] = {
            "base": fit}
    for hint, change in tries.items():
        if e.close(rope(**change), e.bad):
            yield f"hint: {hint}"
            return


USUAL_BASES = (1e4, 1e5, 5e5, 1e6, 1e7)  # RoPE bases models ship with: a fitted base this close is taken as it


def _fitted_base(cfg, x, bad, positions, scale, ff):
    """The RoPE base that the rotation of x into bad shows at the first positive position p: pair i turns by
    p / scale * base^(-2i/R) / ff_i, read where that angle is under 2 (no turn past pi), as a median over pairs."""
    p = next((p for p in positions if p > 0), None)
    if p is None or not cfg.rope_dim:
        return None
    t, half = list(positions).index(p), cfg.rope_dim // 2
    if cfg.rope_layout == "interleaved":  # pair i at (i, i + R/2)
        x, bad = (archs.permute_qk(a, "half", cfg.rope_dim) for a in (x, bad))
    zx, zb = x[t, :, :half] + 1j * x[t, :, half:2 * half], bad[t, :, :half] + 1j * bad[t, :, half:2 * half]
    angle = np.angle(np.sum(zb * np.conj(zx), axis=0))  # [R/2], summed over heads
    i = np.arange(1, half)
    freq = angle[1:] * scale / p * (1.0 if ff is None else ff[1:])
    use = (angle[1:] > 1e-6) & (angle[1:] < 2)
    if not use.any():
        return None
    fit = float(np.exp(np.median(-np.log(freq[use]) * cfg.rope_dim / (2 * i[use]))))
    return next((b for b in USUAL_BASES if abs(fit / b - 1) < 1e-3), fit)


def sliding_window(e):
    """A local layer that attends to every earlier key (its window not applied), a global layer given the window,
    or the window one key off."""
    inputs = e.inputs() if e.stage == "kq_soft_max" and e.cfg is not None and e.cfg.sliding_window else None
    if not inputs:
        return
    (kq,) = inputs
    W, local = e.cfg.sliding_window, e.cfg.is_windowed(e.layer)
    vis = visible(e.stage, e.positions, kq.shape)
    gap = np.asarray(e.positions)[:, None] - np.arange(kq.shape[-1])[None, :]  # query position - key position

    def weights(window):  # the model's softmax of MINE's kq, a query seeing its last `window` keys (None: all)
        return _attention(kq, e.cfg.kq_scale, vis & (True if window is None else gap < window),
                          e.cfg.attn_softcap, _sinks(e))[e.valid]

    local_layers = [i for i in range(e.cfg.n_layer) if e.cfg.is_windowed(i)]
    pattern = (f"or the pattern of local and global layers is off: this model's local layers are "
               f"{', '.join(map(str, local_layers))} of {e.cfg.n_layer}")
    tries = {f"matches attention over every earlier key: this local layer's sliding window ({W}) is not applied "
             f"({pattern})": None,
             f"matches a window of {W + 1} keys; the model's is {W} (a query sees keys j > p - {W})": W + 1,
             f"matches a window of {W - 1} keys; the model's is {W} (a query sees keys j > p - {W})": W - 1} \
        if local else {f"matches attention over the last {W} keys only: a sliding window on this global layer "
                       f"(the window applied on every layer, {pattern})": W}
    for hint, window in tries.items():
        if e.close(weights(window), e.b):
            yield f"hint: {hint}"
            return


def learned_positions(e):
    """GPT-2's learned positions: not added, or their rows taken one position off."""
    arch = archs.get(e.cfg.arch) if e.cfg is not None and e.model is not None else None
    if arch is None or "pos_embd" not in arch.INPUTS or e.stage not in ("pos_embd", "inpL"):
        return
    base = _stages(e.bad_dump, ["inp_embd"], e.positions) if e.stage == "inpL" else [0.0]
    if not base:
        return

    def rows(shift):
        at = np.clip(np.asarray(e.positions) + shift, 0, e.cfg.n_ctx_train - 1)
        return base[0] + to_numpy(embedding(e.model.xp.asarray(at), e.model.weights["position_embd"]))

    if e.stage == "inpL" and e.close(base[0], e.bad):
        yield "hint: inpL equals inp_embd: the learned position embeddings (position_embd) are not added"
        return
    for shift, how in ((1, "p + 1 (positions counted from 1)"), (-1, "p - 1")):
        if e.close(rows(shift), e.bad):
            yield f"hint: matches position_embd's rows {how}: the positions are off by one"
            return


def _q_input(cfg):  # the stage RoPE rotates: q after its norm where the family has one
    return archs.wiring(archs.get(cfg.arch))["Qcur_rope"].reads[0]


def _rope_tables(e, local):  # the cache's cos, sin at the compared positions, of the local or the global layers
    cache = e.model.cache
    tables = (cache.cos_swa, cache.sin_swa) if local and e.cfg.rope_base_swa else (cache.cos, cache.sin)
    return (to_numpy(t)[e.positions] for t in tables)


BIASES = {s: f.weight for s, f in WIRING.items() if f.kind == "product" and s not in ROUTED}  # the stages right
# after a projection (a token's row each) that may have a bias


def one_vector_added(e):
    """MINE = expected + one vector at every position: a bias dropped or added (in some heads only: their slice)."""
    if e.stage not in BIASES or len(e.positions) < 2:
        return
    d = e.bad.astype(np.float64) - e.want
    offset = d.mean(axis=0)  # [X] or [n, HD]
    if not np.any(offset) or not e.close(e.want + offset, e.bad):
        return
    where = ""
    if d.ndim == 3:
        heads = [h for h in range(d.shape[1]) if np.sqrt(np.mean(offset[h] ** 2)) > 1e-3 * np.sqrt(np.mean(e.w ** 2))]
        if len(heads) < d.shape[1]:
            where = f", in head{'s' if len(heads) > 1 else ''} {spans(heads)} only (their slice of it)"
    yield (f"hint: the expected values plus one vector at every position{where}: {BIASES[e.stage]}'s bias dropped, "
           "or added where the model has none")


def _logits_with(e, head, softcap):  # MINE's result_norm through `head`, soft-capped or not; None without them
    inputs = e.inputs() if e.model is not None and e.stage == "result_output" else None
    if not inputs:
        return None
    logits = linear(e.model.xp.asarray(inputs[0].astype(np.float32)), e.model.weights[head])
    return to_numpy(e.model.ops.softcap(logits, e.cfg.logit_softcap) if softcap else logits)


def missing_softcap(e):
    """Logits that skipped the model's soft-cap (Gemma's cap * tanh(logits / cap))."""
    logits = _logits_with(e, "output", False) if e.cfg is not None and e.cfg.logit_softcap else None
    if logits is not None and e.close(logits, e.bad):
        yield f"hint: matches the logits before the soft-cap: cap * tanh(logits / cap), cap {e.cfg.logit_softcap:g}"


def tied_output_head(e):
    """MINE's logits are result_norm times token_embd: the embedding table used where the model has its own head."""
    w = e.model.weights if e.model is not None else {}
    untied = "output" in w and w["output"] is not w.get("token_embd")
    logits = _logits_with(e, "token_embd", e.cfg.logit_softcap) if untied else None
    if logits is not None and e.close(logits, e.bad):
        yield ("hint: matches result_norm times token_embd: the embedding table used as the output head, where "
               "this model has its own (output.weight, untied)")


def skipped_post_norm(e):
    """A residual add that skipped the norm after attention or the feed-forward (Gemma's and OLMo 2's post-norms)."""
    arch = archs.get(e.cfg.arch) if e.cfg is not None else None
    if arch is None or "attn_post_norm" not in arch.STAGES or e.stage not in ("sa_out", "ffn_inp", "l_out"):
        return
    stream = archs.feeds(arch, e.stage, e.layer)[0]
    parts = [stream, f"{'ffn_out' if e.stage == 'l_out' else 'attn_out'}-{e.layer}"]  # the output, its norm skipped
    inputs = _stages(e.bad_dump, parts, e.positions)
    if inputs and e.close(inputs[0] + inputs[1], e.bad):
        norm = "ffn_post_norm" if e.stage == "l_out" else "attn_post_norm"
        yield (f"hint: {e.stage} = {parts[0].rsplit('-', 1)[0]} + {parts[1].rsplit('-', 1)[0]} with no {norm}: the "
               "norm of the block's output before the residual add is skipped")


NORMS = {s: f.weight for s, f in WIRING.items() if f.kind == "norm"} | {"result_norm": "output_norm"}  # their weights


def _norm(e):  # -> (the norm's Weight row, its weight, MINE's input at the compared positions, its name) or None
    arch = archs.get(e.cfg.arch) if e.cfg is not None and e.model is not None else None
    if arch is None or e.stage not in NORMS or e.stage not in ("result_norm", *arch.STAGES):
        return None
    key = NORMS[e.stage]
    rows = {w.key: w for w in (arch.WEIGHTS if e.stage == "result_norm" else arch.LAYER_WEIGHTS)}
    name = f"l_out-{e.cfg.n_layer - 1}" if e.stage == "result_norm" else archs.feeds(arch, e.stage, e.layer)[0]
    for d in (e.bad_dump, e.ref):  # REF's where MINE dumps no input of its norm: the stages before agree
        inputs = _stages(d, [name], e.positions) if d is not None else None
        if inputs is None and d is not None and name == "inp_scaled":  # no scaled embeddings: inp_embd, scaled
            inputs = _stages(d, ["inp_embd"], e.positions)
            inputs = inputs and [inputs[0].astype(np.float32) * np.float32(e.cfg.embedding_scale)]
        if inputs:
            break
    w = e.model.weights if e.stage == "result_norm" else e.model.weights["layers"][e.layer]
    if not inputs or key not in rows or key not in w:
        return None
    return rows[key], to_numpy(w[key]).astype(np.float32), inputs[0].astype(np.float32), name


def skipped_norm(e):
    """A norm skipped (the stage equals its input), or its weight not applied (the input normed, times 1); any of a
    block's norms or the final one. Qwen3's and Gemma 3's q/k norms: qk_norm_variants."""
    norm = _norm(e) if e.stage not in ("Qcur_normed", "Kcur_normed") else None
    if norm is None:
        return
    row, w, x, source = norm
    if e.close(x, e.bad):
        yield f"hint: equals its input ({source}): the norm ({row.key}) is skipped"
    elif e.cfg.arch != "gpt2" and e.close(rms_norm(x, np.ones_like(w), e.cfg.rms_eps), e.bad):
        yield f"hint: matches the input RMS-normed without its weight: {row.key} is not multiplied in"


RESIDUAL_SUMS = [s for s, f in WIRING.items() if f.kind == "sum" and f.reads[0] in ((IN,), RESIDUAL)]  # the stream
# plus a sublayer's output


def missing_residual(e):
    """A residual sum that lost one addend: equal to the block's output alone (the stream not added: a dropped
    residual), or to the stream alone (the output not added). Both read from the side's own dump."""
    arch = archs.get(e.cfg.arch) if e.cfg is not None else None
    if arch is None or e.stage not in RESIDUAL_SUMS or e.layer is None:
        return
    stream = archs.feeds(arch, e.stage, e.layer)[0]
    part = next((f"{p}-{e.layer}" for p in WIRING[e.stage].reads[1] if f"{p}-{e.layer}" in e.bad_dump), None)  # the
    # output it adds: the first of the alternatives the dump holds (a mixture's layer: ffn_moe_out)
    inputs = _stages(e.bad_dump, [stream, part], e.positions) if part else None
    if inputs is None:
        return
    if e.close(inputs[1], e.bad):
        yield (f"hint: equals {part} alone: the residual is not added ({e.stage} = {stream} + "
               f"{part.rsplit('-', 1)[0]})")
    elif e.close(inputs[0], e.bad):
        yield f"hint: equals {stream}: {part.rsplit('-', 1)[0]} is not added to the residual"


def mask_off_by_one(e):
    """The causal mask one key off: each query also sees the key after its own (keys 0..p+1), or not its own
    (0..p-1); re-run as the model's softmax of the side's kq over those keys (and the window, where the layer has
    one)."""
    inputs = e.inputs() if e.stage == "kq_soft_max" and e.cfg is not None else None
    if not inputs:
        return
    (kq,) = inputs
    cfg = e.cfg
    rows = np.broadcast_to((np.asarray(e.positions) > 0)[None, :, None], kq.shape)  # a query with a key before it
    for shift, what in ((1, "also sees the key after its own (keys 0..p+1)"),
                        (-1, "does not see its own key (keys 0..p-1)")):
        use = e.valid & rows if shift < 0 else e.valid
        with np.errstate(invalid="ignore"):  # a first query sees no key at all
            weights = _attention(kq, cfg.kq_scale, _model_mask(e, kq, shift), cfg.attn_softcap, _sinks(e))
        if use.any() and e.close(weights[use], e.bad[use]):
            yield f"hint: matches the causal mask one key off: each query {what}; it sees keys up to its own"
            return


def neighbour_layer(e):
    """A block computed with its neighbour's weights (an index off by one where a layer's tensors are read): the
    stage re-run on the side's own inputs with block L - 1's weights, then L + 1's."""
    name = f"{e.stage}-{e.layer}"
    if e.model is None or e.layer is None or name not in e.bad_dump or e.stage not in (*BIASES, *NORMS):
        return  # only a stage its layer's weights compute: the two re-runs are whole forwards
    layers = e.model.weights["layers"]
    for other in (e.layer - 1, e.layer + 1):
        if not 0 <= other < len(layers):
            continue
        own = layers[e.layer]
        layers[e.layer] = layers[other]
        try:
            rerun = Forced(e.model, e.bad_dump)
        finally:
            layers[e.layer] = own
        if name in rerun and set(e.positions) <= set(rerun.positions(name)) \
                and e.close(take(rerun, name, e.positions, slots=e.bad_dump), e.bad):
            yield (f"hint: matches {name} computed with block {other}'s weights: layer {e.layer} reads its "
                   f"neighbour's tensors (blk.{other}.*), an index off by one where a layer's weights are loaded")
            return


def norm_weight_without_one(e):
    """A (1 + w) norm computed with w: the HF checkpoint's w used as the weight (Gemma's norms)."""
    norm = _norm(e)
    if norm is not None and norm[0].hf_add:
        row, w, x, _ = norm
        if e.close(rms_norm(x, w - np.float32(row.hf_add), e.cfg.rms_eps), e.bad):
            yield (f"hint: matches the RMS norm times (weight - {row.hf_add:g}): the norm multiplies by (1 + w) "
                   f"and the HF checkpoint stores w; the 1 was not added to {row.key}")


def qk_norm_variants(e):
    """Qwen3's and Gemma 3's per-head q/k norm skipped, or taken over the whole row of heads."""
    norm = _norm(e) if e.stage in ("Qcur_normed", "Kcur_normed") else None
    if norm is None:
        return
    _, w, x, _ = norm  # x: [T, n, HD]
    whole = rms_norm(x.reshape(len(x), -1), np.tile(w, x.shape[1]), e.cfg.rms_eps).reshape(x.shape)
    if e.close(x, e.bad):
        yield f"hint: equals {e.stage[:4]}: the per-head norm ({NORMS[e.stage]}) is skipped"
    elif e.close(whole, e.bad):
        yield (f"hint: matches {e.stage[:4]} normed over all its heads at once; {NORMS[e.stage]} norms each head "
               "over its own HD dims")


def missing_embedding_scale(e):
    """The first norm of an embedding-scaled model (Gemma: sqrt(D), Granite: its multiplier) computed on the unscaled
    embeddings; RMSNorm hides most of the scale, so the error is small."""
    arch = archs.get(e.cfg.arch) if e.cfg is not None and e.model is not None else None
    if arch is None or "inp_scaled" not in arch.INPUTS or (e.stage, e.layer) != ("attn_norm", 0):
        return
    inputs = _stages(e.bad_dump, ["inp_embd"], e.positions)
    if inputs:
        w = to_numpy(e.model.weights["layers"][0]["attn_norm"]).astype(np.float32)
        if e.close(rms_norm(inputs[0].astype(np.float32), w, e.cfg.rms_eps), e.bad):
            yield ("hint: matches attn_norm of inp_embd, not of inp_scaled: the embeddings' scale "
                   f"({e.cfg.embedding_scale:g}) is missing")


def _model_mask(e, kq, shift=0):  # -> [H, T, S] bool: the keys the model lets each compared query see
    """Keys up to the query's own (`shift` keys past it: a mask one key off) and inside the layer's window, if any."""
    cfg = e.cfg
    window = cfg.sliding_window if cfg.is_windowed(e.layer) else None
    gap = np.asarray(e.positions)[:, None] - np.arange(kq.shape[-1])[None, :]  # query position - key position
    return np.isfinite(kq) & (gap >= -shift) & (True if window is None else gap < window)


def attention_softcap(e):
    """Gemma 2's scores soft-capped wrongly: not at all, before the softmax scale, or with the logits' cap; re-run
    as the model's softmax (or, at kq_scaled_2, the capped scores) of the side's kq."""
    cfg = e.cfg
    if cfg is None or not cfg.attn_softcap or e.stage not in ("kq_scaled_2", "kq_soft_max"):
        return
    inputs = _stages(e.bad_dump, [f"kq-{e.layer}"], e.positions)
    if not inputs:
        return
    kq, cap, scale = np.nan_to_num(inputs[0]), cfg.attn_softcap, cfg.kq_scale
    tries = {f"without their soft-cap (cap * tanh(s / cap), cap {cap:g})": kq * scale,
             f"soft-capped before the softmax scale ({scale:.4g}); the cap applies to the scaled scores":
                 cap * np.tanh(kq / cap) * scale}
    if cfg.logit_softcap and cfg.logit_softcap != cap:
        final = cfg.logit_softcap
        tries[f"soft-capped with the logits' cap ({final:g}); the attention's is {cap:g}"] = \
            final * np.tanh(kq * scale / final)
    seen = _model_mask(e, inputs[0])
    for what, scores in tries.items():
        got = _softmax(np.where(seen, scores, -np.inf)) if e.stage == "kq_soft_max" else scores
        if e.close(got[e.valid], e.b):
            yield f"hint: matches the scores {what}"
            return


def nope_layers(e):
    """SmolLM3's NoPE layers: RoPE skipped on a layer that rotates (its Qcur_rope equals Qcur), or applied on one that
    does not (its kq matches the side's q and k rotated)."""
    cfg = e.cfg
    if cfg is None or cfg.nope_layers is None or e.layer is None:
        return
    nope = [i for i in range(cfg.n_layer) if cfg.is_nope(i)]
    if e.stage in ("Qcur_rope", "Kcur_rope") and not cfg.is_nope(e.layer):
        x = _stages(e.bad_dump, [f"{e.stage[:4]}-{e.layer}"], e.positions)
        if x and e.close(x[0], e.bad):
            yield (f"hint: equals {e.stage[:4]}: RoPE is skipped on layer {e.layer}, which rotates (the NoPE layers "
                   f"are {spans(nope)})")
    elif e.stage == "kq" and cfg.is_nope(e.layer):
        keys = list(range(max(e.positions) + 1))
        q = _stages(e.bad_dump, [f"Qcur-{e.layer}"], e.positions)
        k = _stages(e.bad_dump, [f"Kcur-{e.layer}"], keys)
        if not q or not k:
            return
        cos, sin = (to_numpy(t) for t in (e.model.cache.cos, e.model.cache.sin))
        rope = ROPE[cfg.rope_layout]
        q = rope(q[0].astype(np.float32), cos[e.positions], sin[e.positions])
        k = rope(k[0].astype(np.float32), cos[keys], sin[keys])
        kv = np.arange(cfg.n_head) // (cfg.n_head // cfg.n_head_kv)
        kq = np.einsum("thd,shd->hts", q.astype(np.float64), k[:, kv].astype(np.float64))
        if e.close(kq[e.valid], e.b):
            yield (f"hint: matches q . k with q and k rotated: RoPE is applied on layer {e.layer}, a NoPE layer "
                   f"(the NoPE layers are {spans(nope)}: their q and k stay unrotated)")


def pre_norm_where_none(e):
    """OLMo 2's blocks read the residual itself: q/k/v (or the feed-forward's gate and up) computed from the
    RMS-normed residual, with no weight or the post-norm's, as a Llama-shaped port would."""
    cfg = e.cfg
    if cfg is None or e.model is None or cfg.arch != "olmo2" or e.layer is None:
        return
    arch, lw = archs.get(cfg.arch), e.model.weights["layers"][e.layer]
    matrix, source, norm = {"Qcur": ("attn_q", block_input(arch.INPUTS, e.layer), "attn_post_norm"),
                            "Kcur": ("attn_k", block_input(arch.INPUTS, e.layer), "attn_post_norm"),
                            "Vcur": ("attn_v", block_input(arch.INPUTS, e.layer), "attn_post_norm"),
                            "ffn_gate": ("ffn_gate", f"ffn_inp-{e.layer}", "ffn_post_norm"),
                            "ffn_up": ("ffn_up", f"ffn_inp-{e.layer}", "ffn_post_norm")}.get(e.stage, (None,) * 3)
    inputs = _stages(e.bad_dump, [source], e.positions) if matrix else None
    if not inputs:
        return
    x = inputs[0].astype(np.float32)
    where = "attention" if e.stage.endswith("cur") else "the feed-forward"
    for w, how in ((np.ones(cfg.n_embd, np.float32), ""), (to_numpy(lw[norm]).astype(np.float32), f" times {norm}")):
        h = to_numpy(linear(e.model.xp.asarray(rms_norm(x, w, cfg.rms_eps)), lw[matrix])).reshape(e.bad.shape)
        if e.close(h, e.bad):
            yield (f"hint: matches {e.stage} of {source.rsplit('-', 1)[0]} RMS-normed{how}: OLMo 2 has no norm "
                   f"before {where} (it norms {where}'s output, {norm})")
            return


def granite_multipliers(e):
    """A Granite multiplier dropped: the residual's (each block's outputs times residual_multiplier before the add),
    the embeddings' (the stream starts from inp_embd), the logits' (not divided by logits_scaling)."""
    cfg = e.cfg
    if cfg is None or cfg.arch != "granite":
        return
    arch = archs.get(cfg.arch)
    if e.stage == "result_output" and cfg.logit_scale != 1.0:
        logits = _logits_with(e, "output", False)
        if logits is not None and e.close(logits, e.bad):
            yield f"hint: matches the logits not divided by logits_scaling ({cfg.logit_scale:g})"
        return
    if e.stage not in ("ffn_inp", "l_out") or e.layer is None:
        return
    stream, part = ((block_input(arch.INPUTS, e.layer), f"attn_out-{e.layer}") if e.stage == "ffn_inp"
                    else (f"ffn_inp-{e.layer}", f"ffn_out-{e.layer}"))
    inputs = _stages(e.bad_dump, [stream, part], e.positions)
    if not inputs:
        return
    x, h = inputs
    r = np.float32(cfg.residual_scale)
    if cfg.residual_scale != 1.0 and e.close(x + h, e.bad):
        yield (f"hint: {e.stage} = {stream.rsplit('-', 1)[0]} + {part.rsplit('-', 1)[0]}: the output is added without "
               f"the residual multiplier ({cfg.residual_scale:g})")
    elif (e.stage, e.layer) == ("ffn_inp", 0) and cfg.embedding_scale not in (None, 1.0):
        embd = _stages(e.bad_dump, ["inp_embd"], e.positions)
        if embd and e.close(embd[0] + h * r, e.bad):
            yield (f"hint: matches inp_embd + attn_out x {cfg.residual_scale:g}: the stream starts from the unscaled "
                   f"embeddings; the embedding multiplier ({cfg.embedding_scale:g}) is missing")


def missing_mask(e):
    """Weights on keys after each query's position: re-run as the model's softmax of MINE's kq over every key it
    computed (a prompt row: the whole prompt's; a decode step's: the keys cached)."""
    inputs = e.inputs() if e.stage == "kq_soft_max" and e.cfg is not None else None
    if inputs:
        kq = inputs[0]
        if e.close(_attention(kq, e.cfg.kq_scale, np.isfinite(kq), e.cfg.attn_softcap, _sinks(e))[e.valid], e.b):
            yield "hint: matches the softmax over every key, later ones too: the causal mask is missing"


def rounded(e):
    for fmt, rounding in ROUND.items():
        if e.b.size and np.array_equal(rounding(e.b), e.b) and not np.array_equal(rounding(e.w), e.w) \
                and e.bad_dump.numerics != fmt and e.close(rounding(e.w), e.b):
            yield (f'hint: every value is a {fmt} number: rounded to {fmt}; if the engine rounds this stage, declare '
                   f'it: "rounded": {{"{e.stage}": "{fmt}"}} in the manifest ("numerics": "{fmt}" only if every '
                   "stage is)")
            return


READS_OTHER_POSITIONS = ("Qcur_rope", "Kcur_rope", "kq", "kq_scaled_2", "kq_soft_max", "kqv_out", "attn_pregate",
                         "conv_output_raw", "attn_output")  # RoPE, attention, linear attention's conv and delta rule


def _wrong_rows(e):  # -> [P] bool: the compared positions where the stage is wrong
    return _error_by(np.where(e.valid, e.bad.astype(np.float64) - e.want, np.nan), float(np.mean(e.w ** 2)) or 1.0,
                     Dump.axis_of(e.stage)) > e.exact


def _decode_steps(e, rows):  # -> the decode steps' positions if `rows` ([P] bool) marks just them, else None
    n_prompt = len(e.bad_dump.prompt_ids)
    decode = [p >= n_prompt for p in e.positions]
    return spans([p for p in e.positions if p >= n_prompt]) if any(decode) and list(rows) == decode else None


def decode_path(e):
    """Right in the prompt's prefill, wrong in the decode steps: where the decode path parts from the prefill's."""
    steps = _decode_steps(e, _wrong_rows(e))
    if steps is None:
        return
    where = ("its position, its KV cache slot or recurrent state, its mask" if e.stage in READS_OTHER_POSITIONS else
             f"a step of {e.stage} that the one-token path takes otherwise than the prefill, not the KV cache: "
             f"{e.stage} reads no other position")
    yield f"hint: the prompt's positions are right and the decode steps' ({steps}) are not: the decode path ({where})"


def later_positions(e):
    wrong = _wrong_rows(e)
    if len(e.positions) > 1 and not wrong[0] and wrong[1:].all() \
            and not (e.stage == "kq_soft_max" and e.positions[0] == 0):  # a causal softmax's first row is always 1
        yield ("hint: the first position is right and the later ones are not: something that depends on the "
                "position (RoPE's theta or positions, the mask, the KV cache)")


def routing_choice(e):
    """Other experts chosen (ffn_moe_topk, both sides' ids in ascending order): per token the overlap, and whether
    REF's K-th and (K+1)-th probabilities are a near-tie within the tolerance (either choice then right on its own
    probabilities, which refllama's re-run of each side excuses); or every id shifted by one."""
    if e.stage != "ffn_moe_topk" or e.bad.shape != e.want.shape:
        return
    bad, want = e.bad.astype(np.int64), e.want.astype(np.int64)
    wrong = [i for i in range(len(bad)) if set(bad[i]) != set(want[i])]
    n_expert = e.cfg.n_expert if e.cfg is not None else int(max(bad.max(), want.max())) + 1
    for shift in (1, -1):
        if np.array_equal(np.sort((want + shift) % n_expert, axis=1), bad):
            yield (f"hint: every expert id is REF's {shift:+d} (mod {n_expert}): an expert index off by one in the "
                   "routing")
            return
    if not wrong:
        return
    i = wrong[0]
    line = (f"hint: other experts chosen at {len(wrong)} of {len(bad)} tokens (first, position {e.positions[i]}: "
            f"{bad[i].tolist()} where REF chose {want[i].tolist()}, {len(set(bad[i]) & set(want[i]))} of "
            f"{bad.shape[1]} shared)")
    probs = _stages(e.good, [f"ffn_moe_probs-{e.layer}"], [e.positions[j] for j in wrong])
    if probs:
        ranked = -np.sort(-probs[0], axis=1)  # [W, E], most probable first
        K = bad.shape[1]
        gaps = ranked[:, K - 1] - ranked[:, K] if ranked.shape[1] > K else np.full(len(wrong), np.inf)
        ties = int(np.sum(gaps <= e.exact ** 0.5))
        line += (f"; at {ties} of them REF's K-th and (K+1)-th probabilities differ by at most {gaps.max():.2g}: a "
                 "near-tie at the top-k boundary, excused where each side's choice is right on its own probabilities"
                 if ties else "; no near-tie at the top-k boundary: the router's logits or its softmax differ")
    yield line


def routing_weights(e):
    """The experts' weights: a sigmoid or no softmax where the router's is a softmax (ffn_moe_probs); the K weights
    renormalised where the family keeps them, or not where it renormalises (recomputed from the side's own
    ffn_moe_weights and ffn_moe_down, at ffn_moe_weighted or ffn_moe_out)."""
    if e.stage in ("ffn_moe_logits", "ffn_moe_probs") and e.bad.ndim == 2:
        for shift in (1, -1):
            if e.close(np.roll(e.want, -shift, axis=1), e.bad):
                yield (f"hint: {e.stage} of expert e is the expected one of expert e{shift:+d}: the router's rows "
                       "(ffn_gate_inp) are read with an index off by one")
                return
    if e.stage == "ffn_moe_probs":
        logits = _stages(e.bad_dump, [f"ffn_moe_logits-{e.layer}"], e.positions)
        if logits and (e.cfg is None or e.cfg.expert_gating == "softmax"):  # gpt-oss's: oai_router's
            for label, f in (("a sigmoid", lambda x: 1 / (1 + np.exp(-x))), ("no softmax (the logits)", lambda x: x)):
                if e.close(f(logits[0]), e.bad):
                    yield f"hint: matches {label} of ffn_moe_logits; the router's probabilities are a softmax"
        return
    if e.stage not in ("ffn_moe_weights", "ffn_moe_weights_norm", "ffn_moe_weighted", "ffn_moe_out"):
        return
    source = e.good if e.stage == "ffn_moe_weights" else e.bad_dump  # the weights as top-k gathers them
    parts = _stages(source, [f"ffn_moe_weights-{e.layer}", f"ffn_moe_down-{e.layer}"], e.positions)
    if not parts:
        return
    w, down = parts  # [T, K], [T, K, D], both in the order of the experts' ids (take)
    forms = {True: w / w.sum(axis=1, keepdims=True), False: w}  # renormalised or not
    family = e.cfg.expert_norm if e.cfg is not None else None  # whether this model renormalises them
    wrong = _wrong_rows(e)
    for norm, weights in forms.items():
        value = weights if e.stage.startswith("ffn_moe_weights") else down * weights[..., None]
        value = value.sum(axis=1) if e.stage == "ffn_moe_out" else value
        if family is norm or not wrong.any() or not e.close(value[wrong], e.bad[wrong]) \
                or e.close(value[wrong], e.want[wrong]):
            continue  # a form the model itself takes is no bug, whatever the values say
        steps = _decode_steps(e, wrong)
        where = "" if wrong.all() else f" in the decode steps ({steps}) only" if steps else \
            f" at positions {spans([p for p, x in zip(e.positions, wrong, strict=True) if x])} only"
        yield ("hint: the K weights are renormalised to sum to 1 (or the softmax is taken over the K chosen experts "
               f"only, after top-k){where}" if norm else f"hint: the K weights are not renormalised{where}") + (
            "" if family is None else "; this model keeps them as the softmax gave them" if norm else
            "; this model divides them by their sum (norm_topk_prob)") + (
            "; the prefill's are right: the decode path routes otherwise" if steps else "")


def missing_shared_expert(e):
    """Qwen2-MoE's shared expert left out (ffn_out = ffn_moe_out), or added without its gate."""
    if e.stage not in ("ffn_out", "l_out") or e.cfg is None or not e.cfg.n_ff_shexp or e.layer is None:
        return
    moe = _stages(e.bad_dump, [f"ffn_moe_out-{e.layer}"], e.positions) or _stages(
        e.good, [f"ffn_moe_out-{e.layer}"], e.positions)
    base = [0.0] if e.stage == "ffn_out" else _stages(e.bad_dump, [f"ffn_inp-{e.layer}"], e.positions)
    if not moe or not base:
        return
    if e.close(base[0] + moe[0], e.bad):
        yield "hint: equals ffn_moe_out alone: the shared expert (ffn_*_shexp) is not added"
        return
    shexp = _stages(e.good, [f"ffn_shexp-{e.layer}"], e.positions)
    if shexp and e.close(base[0] + moe[0] + shexp[0], e.bad):
        yield "hint: equals ffn_moe_out + the shared expert ungated: its gate, sigmoid(ffn_gate_inp_shexp), is missing"


def shifted_experts(e):
    """Each chosen expert's product made with a neighbour's matrices (an index off by one into the experts)."""
    name = {"ffn_moe_gate": "ffn_gate_exps", "ffn_moe_up": "ffn_up_exps"}.get(e.stage)
    if name is None or e.model is None or e.layer is None:
        return
    parts = _stages(e.bad_dump, [f"ffn_norm-{e.layer}", f"ffn_moe_topk-{e.layer}"], e.positions)
    if not parts:
        return
    x, ids = parts[0].astype(np.float32), np.sort(parts[1].astype(np.int64), axis=1)  # slots in id order, as take's
    mats = e.model.weights["layers"][e.layer][name]
    for shift in (1, -1):
        pred = np.stack([np.stack([to_numpy(linear(x[t:t + 1], mats[(k + shift) % len(mats)]))[0] for k in row])
                         for t, row in enumerate(ids)])
        if e.close(pred, e.bad):
            yield (f"hint: each slot's product is made with expert e{shift:+d}'s matrices (mod {len(mats)}): the "
                   "experts' index is off by one where their weights are read")
            return


def permuted_slot_weights(e):
    """Each token's K weights right, each on another expert than the one it weighs (the weights and the expert ids
    taken apart, or sorted separately): at ffn_moe_weights a permutation of REF's row; at ffn_moe_weighted each slot's
    product its own expert's output times another slot's weight."""
    if e.stage == "ffn_moe_weights" and e.bad.ndim == 2:
        same_set = e.close(np.sort(e.bad, axis=1), np.sort(e.want, axis=1))
    elif e.stage == "ffn_moe_weighted" and e.bad.ndim == 3:
        parts = next((p for p in (_stages(e.good, [f"{w}-{e.layer}", f"ffn_moe_down-{e.layer}"], e.positions)
                                  for w in ("ffn_moe_weights_norm", "ffn_moe_weights")) if p), None)
        if not parts:
            return
        w, down = parts  # [T, K] (renormalised where the model does), [T, K, D]
        scale = (e.bad * down).sum(axis=-1) / np.maximum((down * down).sum(axis=-1), 1e-30)  # each slot's weight
        same_set = e.close(down * scale[..., None], e.bad) and e.close(np.sort(scale, axis=1), np.sort(w, axis=1))
    else:
        return
    if same_set and not e.close(e.bad, e.want):
        yield ("hint: each token's K weights are the expected ones on other experts (a permutation of the slots): "
               "an expert is weighted by another slot's weight; keep ffn_moe_topk's ids and their weights together")


def router_input(e):
    """The router's logits of another stage than ffn_norm (the residual before its norm, the attention's norm)."""
    if e.stage != "ffn_moe_logits" or e.model is None or e.layer is None:
        return
    router = e.model.weights["layers"][e.layer].get("ffn_gate_inp")
    for other in ("ffn_inp", "attn_norm"):
        x = _stages(e.bad_dump, [f"{other}-{e.layer}"], e.positions) or _stages(e.ref, [f"{other}-{e.layer}"],
                                                                                e.positions)  # agrees before it
        if router is not None and x and e.close(to_numpy(linear(x[0].astype(np.float32), router)), e.bad):
            yield (f"hint: ffn_moe_logits-{e.layer} is the router (ffn_gate_inp) applied to {other}-{e.layer}: the "
                   f"router reads ffn_norm-{e.layer}, the feed-forward's normed input")
            return


def least_probable_experts(e):
    """The K least probable experts chosen: top-k taken from the wrong end of the probabilities."""
    if e.stage != "ffn_moe_topk" or e.bad.ndim != 2:
        return
    probs = _stages(e.good, [f"ffn_moe_probs-{e.layer}"], e.positions)
    least = np.argsort(probs[0], axis=1, kind="stable")[:, :e.bad.shape[1]] if probs else None
    if least is not None and np.array_equal(np.sort(least, axis=1), np.sort(e.bad.astype(np.int64), axis=1)):
        yield ("hint: the K least probable experts are chosen at every token: top-k is taken from the wrong end "
               "(an ascending sort, or the largest of the negated probabilities)")


def shared_gate_without_sigmoid(e):
    """Qwen2-MoE's shared-expert gate left as its logit: ffn_shexp_gate = ffn_shexp_gate_inp, and the shared expert's
    output scaled by it."""
    if e.cfg is None or not e.cfg.n_ff_shexp or e.layer is None:
        return
    logit = _stages(e.bad_dump, [f"ffn_shexp_gate_inp-{e.layer}"], e.positions) or _stages(
        e.ref, [f"ffn_shexp_gate_inp-{e.layer}"], e.positions)  # REF's where MINE dumps none (it is upstream)
    if not logit:
        return
    if e.stage == "ffn_shexp_gate" and e.close(logit[0], e.bad):
        yield ("hint: ffn_shexp_gate equals its input ffn_shexp_gate_inp: the shared expert's gate is missing its "
               "sigmoid")
    elif e.stage in ("ffn_shexp_out", "ffn_out"):
        parts = _stages(e.good, [f"ffn_shexp-{e.layer}", f"ffn_moe_out-{e.layer}"], e.positions)
        if parts:
            shexp, moe = parts
            value = shexp * logit[0] + (moe if e.stage == "ffn_out" else 0)
            if e.close(value, e.bad) and not e.close(value, e.want):
                yield ("hint: the shared expert's output is scaled by ffn_shexp_gate_inp itself: its gate is missing "
                       "its sigmoid")


def _other_layout(cfg):
    return "half" if cfg.rope_layout == "interleaved" else "interleaved"


def _inputs_of(stage, layer, dump, positions, cfg=None):
    """The dump's own inputs of a stage whose hints need them, at `positions`, or None: as the block's wiring feeds
    it, but a softmax's raw scores kq (its hints scale and cap them themselves)."""
    if stage == "result_output":
        names = ["result_norm"]
    elif stage == "kq_soft_max":
        names = [f"kq-{layer}"]
    elif stage in INPUTS_READ and cfg is not None:
        names = archs.feeds(archs.get(cfg.arch), stage, layer or 0)
    else:
        return None
    return _stages(dump, names, positions) if names else None


INPUTS_READ = ("ffn_swiglu", "ffn_geglu", "ffn_gelu", "attn_norm", "ffn_norm", "Qcur_rope", "Kcur_rope", "gate",
               "ffn_moe_swiglu_oai", "ffn_moe_gate_biased", "ffn_moe_up_biased", "ffn_moe_down_biased",
               "a_softplus", "q_conv_predelta", "k_conv_predelta", "final_output", "beta_sigmoid", "attn_gated")  # the
# stages whose hints re-run them from their inputs (_inputs_of)


def _stages(dump, names, positions):
    """Those stages of a dump at `positions` (float64), or None if it lacks one."""
    if not all(n in dump and set(positions) <= set(dump.positions(n)) for n in names):
        return None
    return [take(dump, n, positions).astype(np.float64) for n in names]


def _attention(kq, scale, seen, cap=None, sinks=None):  # softmax(kq * scale) over the keys `seen` marks (kq may be NaN
    """elsewhere). The scaled scores soft-capped first where the model caps them (`cap`: Gemma 2's
    attn_logit_softcapping); `sinks` [H]: a logit a head in the denominator (gpt-oss's)."""
    s = np.nan_to_num(kq) * scale
    x = np.where(seen, cap * np.tanh(s / cap) if cap else s, -np.inf)
    return _softmax(x) if sinks is None else sink_softmax(x, np.asarray(sinks))


def _sinks(e):  # the layer's sink logits [H] (gpt-oss's attn_sinks), or None (none, or no model to read them from)
    lw = e.model.weights["layers"][e.layer] if e.model is not None and e.layer is not None else {}
    return to_numpy(lw["attn_sinks"]).astype(np.float64) if "attn_sinks" in lw else None


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _gelu(x):
    from math import erf

    return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))


GATED = {"ffn_swiglu": "silu", "ffn_geglu": "gelu_tanh", "ffn_gelu": "gelu_tanh"}  # a unit's stage: its activation
ACTIVATIONS = {  # what engines put where a gated unit's activation belongs
    "silu": silu,
    "gelu": _gelu,
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "identity": lambda x: x,
}


# the hybrids' linear attention (Gated DeltaNet) and gated attention


def _layer_weight(e, key):  # the layer's weight (a vector, a conv's taps) as float64
    return to_numpy(e.model.weights["layers"][e.layer][key]).astype(np.float64)


def linear_decay(e):
    """The decay's factor from A_log as HF stores it, or -exp applied to a file's ssm_a that already is -exp(A_log),
    or without its sign: gate = a_softplus times another function of the file's ssm_a."""
    inputs = e.inputs() if e.stage == "gate" and e.model is not None else None
    if not inputs:
        return
    a = _layer_weight(e, "ssm_a")
    tries = {"log(-ssm_a): A_log as HF stores it, where the decay's factor is -exp(A_log) (the file's ssm_a)":
             np.log(-a), "-exp(ssm_a): -exp applied twice (the file's ssm_a already is -exp(A_log))": -np.exp(a),
             "-ssm_a: its sign lost (exp(gate) must be a decay, below 1)": -a}
    text = next((t for t, f in tries.items() if e.close(inputs[0] * f, e.bad)), None)
    if text:
        yield f"hint: matches a_softplus times {text}"


def decay_without_dt_bias(e):
    inputs = e.inputs() if e.stage == "a_softplus" else None
    if inputs and e.close(softplus(inputs[0]), e.bad):
        yield ("hint: matches the softplus of the projection alone: dt_bias (the file's ssm_dt) is not added before "
               "the softplus")


def conv_state(e):
    """The short conv of each token from a zero state (its last CK - 1 inputs not carried from the call before: a
    decode step's conv sees only its own token), or with its kernel in the other order."""
    if e.stage != "conv_output_raw" or e.model is None:
        return
    w = _layer_weight(e, "ssm_conv1d")  # [C, CK]
    qkv = f"linear_attn_qkv_mixed-{e.layer}"
    source = e.bad_dump if qkv in e.bad_dump else e.ref  # REF's input where MINE dumps none (upstream: equal)
    here = _stages(source, [qkv], e.positions)
    later = (np.asarray(e.positions) >= len(e.bad_dump.prompt_ids))[:, None]  # the decode steps' rows
    if here and later.any() and e.close(np.where(later, here[0] * w[:, -1], e.want), e.bad):
        yield ("hint: matches the conv of each token alone: the conv state (its last CK - 1 inputs) is not carried "
               "from the call before (a decode step, or a prompt's next batch)")
        return
    every = _stages(source, [qkv], list(range(max(e.positions) + 1)))
    if every:
        y = causal_conv(every[0], np.zeros((w.shape[1] - 1, w.shape[0])), w[:, ::-1])[0][e.positions]
        if e.close(y, e.bad):
            yield "hint: matches the conv with its kernel reversed: tap j multiplies the input j - (CK - 1) steps back"


def qk_not_l2_normed(e):
    inputs = e.inputs() if e.stage in ("q_conv_predelta", "k_conv_predelta") else None
    if not inputs:
        return
    x, r = inputs[0], e.bad.shape[-2] // inputs[0].shape[-2]
    if r > 1:  # an engine dumping q/k repeated to the v heads, in the model's order
        x = np.tile(x, (1, r, 1)) if e.cfg.linear_v_order == "tiled" else np.repeat(x, r, axis=-2)
    rms = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + e.cfg.rms_eps)
    if e.close(x, e.bad):
        yield f"hint: equals its input ({e.stage[:6]}): {e.stage[0]} is not L2-normalised before the delta rule"
    elif e.close(rms, e.bad):
        yield (f"hint: matches {e.stage[0]} RMS-normed: L2-normalise it (x / |x|, the RMS norm times 1/sqrt(d)) "
               "before the delta rule")


def gated_norm_order(e):
    """The gated RMS norm's other forms: the gate before the norm, the gate without its SiLU."""
    inputs = e.inputs() if e.stage == "final_output" and e.model is not None else None
    if not inputs:
        return
    o, z = inputs[0], inputs[1].reshape(inputs[0].shape)
    w, eps = _layer_weight(e, "ssm_norm"), e.cfg.rms_eps
    if e.close(rms_norm(o * silu(z), w, eps).reshape(e.bad.shape), e.bad):
        yield ("hint: matches rms_norm(o silu(z)) w: the gate applied before the norm, where Qwen3.5's gated norm "
               "is rms_norm(o) w silu(z)")
    elif e.close((rms_norm(o, w, eps) * z).reshape(e.bad.shape), e.bad):
        yield "hint: matches rms_norm(o) w z: the gate z without its SiLU"


def v_head_order(e):
    """Linear attention's v heads in the other order: HF's grouped (v head h reads q/k head h // (LV / LK)) where the
    model's are tiled (h % LK, Qwen3.5's converter reorders them so), or the reverse."""
    cfg = e.cfg
    if cfg is None or e.stage not in V_HEAD_STAGES or cfg.linear_v_heads <= cfg.linear_k_heads:
        return
    for to in ("grouped", "tiled"):
        if e.close(reorder_v_heads(e.stage, e.want, cfg.linear_k_heads, cfg.linear_v_heads, to=to), e.bad):
            mine, theirs = ("grouped", "tiled") if cfg.linear_v_order == "tiled" else ("tiled", "grouped")
            yield (f"hint: equals the expected values with the v heads in {mine} order, where this model's are "
                   f"{theirs}: reorder the v heads' rows of the qkv, z, a, b projections, dt_bias, A_log and the "
                   f"conv, and out_proj's columns, as llama.cpp's converter does (or declare v_head_order)")
            return


def beta_without_sigmoid(e):
    inputs = e.inputs() if e.stage == "beta_sigmoid" else None
    if inputs and e.close(inputs[0], e.bad):
        yield "hint: equals its input beta: beta's sigmoid is missing"


def attention_output_gate(e):
    """The gated attention's output without its gate, or times the gate's raw half of q's projection."""
    inputs = e.inputs() if e.stage == "attn_gated" else None
    if not inputs:
        return
    if e.close(inputs[0], e.bad):
        yield ("hint: equals attn_pregate: the attention output's gate, sigmoid of the second half of each head of "
               "q's projection (Qcur_full), is not applied")
        return
    name = f"Qcur_full-{e.layer}"
    full = _stages(e.bad_dump if name in e.bad_dump else e.ref, [name], e.positions)
    if full:
        H, HD = e.cfg.n_head, e.cfg.head_dim
        raw = full[0].reshape(-1, H, 2, HD)[:, :, 1].reshape(inputs[0].shape)
        if e.close(inputs[0] * raw, e.bad):
            yield "hint: matches attn_pregate times the gate's raw values: the gate's sigmoid is missing"


def attention_sinks(e):
    """gpt-oss's sink logits (attn_sinks, one a head) left out of the softmax, or their term added to every key's
    weight as well as to the denominator: re-run as the model's softmax of the side's kq."""
    sinks = _sinks(e)
    inputs = e.inputs() if e.stage == "kq_soft_max" and sinks is not None else None
    if not inputs:
        return
    (kq,) = inputs
    cfg, seen = e.cfg, _model_mask(e, inputs[0])
    if e.close(_attention(kq, cfg.kq_scale, seen, cfg.attn_softcap)[e.valid], e.b):
        yield ("hint: matches the softmax without the layer's sinks (attn_sinks): each head's sink logit belongs in "
               "the denominator, as a key without a value (a row then sums to less than 1)")
        return
    p = _attention(kq, cfg.kq_scale, seen, cfg.attn_softcap, sinks)
    numerator = np.where(seen, p + (1 - p.sum(axis=-1, keepdims=True)), 0.0)  # (e_j + e_sink) / Z
    if e.close(numerator[e.valid], e.b):
        yield ("hint: matches exp(sink) added to every key's numerator too: the sink's term belongs in the "
               "denominator only, p_j = exp(s_j) / (sum_k exp(s_k) + exp(sink))")


def oai_router(e):
    """gpt-oss's router (llama.cpp's SOFTMAX_WEIGHT): the experts chosen by the router's biased logits, a softmax over
    the K chosen. Its bias not added, a softmax over all E experts (Mixtral's router), or the K weights not
    softmaxed."""
    if e.cfg is None or e.cfg.expert_gating != "softmax_weight":
        return
    if e.stage == "ffn_moe_probs":
        logits = _stages(e.bad_dump if f"ffn_moe_logits-{e.layer}" in e.bad_dump else e.ref,
                         [f"ffn_moe_logits-{e.layer}"], e.positions)
        if logits and e.close(logits[0], e.bad):
            yield ("hint: equals ffn_moe_logits: the router's bias (ffn_gate_inp.bias) is not added before the "
                   "experts are chosen")
        elif e.close(_softmax(e.want), e.bad) or (logits and e.close(_softmax(logits[0]), e.bad)):
            yield ("hint: matches a softmax over all E experts: this router chooses by its biased logits and "
                   "softmaxes only the K chosen (ffn_moe_weights_softmax)")
    elif e.stage == "ffn_moe_weights_softmax":
        parts = _stages(e.good, [f"ffn_moe_weights-{e.layer}"], e.positions)
        if parts and e.close(parts[0], e.bad):
            yield "hint: equals ffn_moe_weights: the K chosen logits are not softmaxed"
            return
        every = _stages(e.good, [f"ffn_moe_probs-{e.layer}", f"ffn_moe_topk-{e.layer}"], e.positions)
        if every:
            probs, ids = every
            if e.close(np.take_along_axis(_softmax(probs), ids.astype(np.int64), axis=1), e.bad):
                yield ("hint: matches the K chosen experts' probabilities of a softmax over all E: the softmax "
                       "belongs over the K chosen logits only (they then sum to 1)")


def clamped_swiglu(e):
    """gpt-oss's unit, gate * sigmoid(alpha gate) * (up + 1), gate clamped above at the limit and up to +-limit:
    re-run on the side's own inputs without a clamp, as plain SwiGLU, without the + 1, or with the alpha that fits."""
    inputs = e.inputs() if e.stage == "ffn_moe_swiglu_oai" and e.cfg is not None and e.cfg.oai_swiglu else None
    if not inputs:
        return
    x, y = inputs
    alpha, limit = e.cfg.oai_swiglu

    def unit(a=alpha, gate=True, up=True, plus=1.0):
        g = np.minimum(x, limit) if gate else x
        return g / (1 + np.exp(-a * g)) * ((np.clip(y, -limit, limit) if up else y) + plus)

    clamp = f"gate clamped above at {limit:g} and up to [-{limit:g}, {limit:g}] before the unit"
    tries = {f"matches the unit without its clamp: {clamp}": unit(gate=False, up=False),
             f"matches the unit without the gate's clamp: {clamp}": unit(gate=False),
             f"matches the unit without up's clamp: {clamp}": unit(up=False),
             f"matches SwiGLU, silu(gate) up: this model's unit is gate sigmoid({alpha:g} gate) (up + 1), {clamp}":
                 silu(x) * y,
             "matches the unit without up's + 1: gate sigmoid(alpha gate) (up + 1)": unit(plus=0.0)}
    for line, value in tries.items():
        if e.close(value, e.bad):
            yield f"hint: {line}"
            return
    grid = np.arange(0.05, 4.0, 0.05)
    coarse = grid[np.argmin([metrics(unit(a), e.bad)["nmse"] for a in grid])]
    fine = np.arange(coarse - 0.05, coarse + 0.05, 0.0005)
    a = float(fine[np.argmin([metrics(unit(a), e.bad)["nmse"] for a in fine])])
    if abs(a / alpha - 1) > 1e-3 and e.close(unit(a), e.bad):
        yield f"hint: matches the clamped SwiGLU with alpha = {a:.4g}: the model's alpha is {alpha:g}"


def expert_biases(e):
    """gpt-oss's experts' biases (llama.cpp's add_id: expert e's bias row added to each slot that chose e) left out,
    or indexed by the slot rather than by the expert's id; or, at a product's own stage, the product dumped with its
    bias already added (llama.cpp dumps the product, then `ffn_moe_{part}_biased`)."""
    biased = e.stage in EXPERT_BIASED
    part = e.stage[len("ffn_moe_"):].removesuffix("_biased")
    if e.stage not in (*EXPERT_BIASED, *EXPERT_PRODUCTS) or e.model is None or \
            f"ffn_{part}_exps_bias" not in e.model.weights["layers"][e.layer]:
        return
    bias = _layer_weight(e, f"ffn_{part}_exps_bias")  # [E, out]
    topk = f"ffn_moe_topk-{e.layer}"
    found = _stages(e.bad_dump if topk in e.bad_dump else e.ref, [topk], e.positions)
    if not found:
        return
    ids = found[0].astype(np.int64)  # [T, K]: each slot's expert, in the order the compared stages take
    if not biased:
        if e.close(e.want + bias[ids], e.bad):
            yield (f"hint: equals the expected {e.stage} plus each expert's bias (ffn_{part}_exps.bias): the product "
                   f"is dumped with its bias added; llama.cpp dumps it before, and the sum as ffn_moe_{part}_biased")
        return
    inputs = e.inputs()
    if not inputs:
        return
    y = inputs[0]
    if e.close(y, e.bad):
        yield f"hint: equals ffn_moe_{part}: the experts' biases (ffn_{part}_exps.bias) are not added"
    elif e.close(y + bias[np.arange(ids.shape[1])][None], e.bad):
        yield (f"hint: matches ffn_moe_{part} plus the bias of expert k in slot k: each slot takes the bias of "
               "the expert it chose (ffn_moe_topk), as llama.cpp's add_id")


EXPERT_BIASED = ("ffn_moe_gate_biased", "ffn_moe_up_biased", "ffn_moe_down_biased")
EXPERT_PRODUCTS = ("ffn_moe_gate", "ffn_moe_up", "ffn_moe_down")


def partial_rope(e):
    """RoPE over a head's every dim where the model rotates only its first rope_dim, or the rotated dims at a full
    head's frequencies (base^(-2i/HD) for base^(-2i/R))."""
    cfg = e.cfg
    inputs = e.inputs() if e.stage in ("Qcur_rope", "Kcur_rope") and cfg is not None and e.model is not None else None
    if not inputs or not 0 < cfg.rope_dim < cfg.head_dim:
        return
    x, n = inputs[0].astype(np.float32), max(e.positions) + 1
    cos, sin = (to_numpy(t)[e.positions] for t in e.model.ops.rope_cos_sin(n, cfg.head_dim, cfg.rope_base))
    R2 = cfg.rope_dim // 2
    if e.close(ROPE[cfg.rope_layout](x, cos, sin), e.bad):
        yield (f"hint: matches RoPE over all {cfg.head_dim} dims of a head: only the first rope_dim = {cfg.rope_dim} "
               "rotate (partial rotary), the rest pass through")
    elif e.close(ROPE[cfg.rope_layout](x, cos[:, :R2], sin[:, :R2]), e.bad):
        yield (f"hint: matches RoPE on the first {cfg.rope_dim} dims at a full head's frequencies: theta_i = "
               f"base^(-2i/{cfg.head_dim}) where partial rotary takes base^(-2i/{cfg.rope_dim})")


def scored_router(e):
    """DeepSeek-V3's router (GLM-4.5's): each expert's sigmoid, a selection bias added to choose the experts and not
    to weigh them, the choice within the best groups of experts, the weights renormalised and scaled. A softmax for
    the sigmoids, the bias on the weights or not in the choice, the groups ignored, the scale left out."""
    cfg = e.cfg
    if cfg is None or cfg.expert_gating != "sigmoid" or e.layer is None:
        return
    L = e.layer
    if e.stage == "ffn_moe_probs":
        logits = _stages(e.bad_dump, [f"ffn_moe_logits-{L}"], e.positions) or _stages(
            e.ref, [f"ffn_moe_logits-{L}"], e.positions)
        if logits and e.close(_softmax(logits[0]), e.bad):
            yield ("hint: matches a softmax of ffn_moe_logits over the experts: this model scores each expert by its "
                   "own sigmoid (expert_gating_func 2; scoring_func sigmoid)")
    elif e.stage == "ffn_moe_weights" and cfg.expert_bias:
        parts = _stages(e.good, [f"ffn_moe_probs_biased-{L}", f"ffn_moe_topk-{L}"], e.positions)
        if parts and e.close(np.take_along_axis(parts[0], np.sort(parts[1].astype(np.int64), axis=1), 1), e.bad):
            yield ("hint: equals the chosen experts' biased scores: the selection bias (exp_probs_b, "
                   "e_score_correction_bias) is added to the weights; it only chooses the experts, which are weighed "
                   "by their unbiased scores (ffn_moe_probs)")
    elif e.stage == "ffn_moe_topk" and e.bad.shape == e.want.shape:
        parts = _stages(e.good, [f"ffn_moe_probs-{L}", f"ffn_moe_probs_biased-{L}"], e.positions)
        if not parts:
            return
        bad, K = np.sort(e.bad.astype(np.int64), axis=1), e.bad.shape[1]
        for scores, line in (
                (parts[1], f"the top K of all E experts: this model chooses within the {cfg.expert_groups_used} best "
                           f"of its {cfg.expert_groups} groups of experts (a group scored by the sum of its two best "
                           "biased scores; expert_group_count, expert_group_used_count; n_group, topk_group)"),
                (parts[0], "the experts the unbiased scores choose: the selection bias (exp_probs_b, "
                           "e_score_correction_bias) is added to the scores before the experts are chosen")):
            if np.array_equal(np.sort(np.argsort(-scores, axis=1, kind="stable")[:, :K], axis=1), bad):
                yield f"hint: {line}"
                return
    elif e.stage in ("ffn_moe_weights_scaled", "ffn_moe_weighted", "ffn_moe_out") and cfg.expert_scale != 1.0:
        if e.close(e.bad * cfg.expert_scale, e.want):
            yield (f"hint: REF's over {cfg.expert_scale:g}: the routing weights are not scaled by "
                   f"routed_scaling_factor (expert_weights_scale {cfg.expert_scale:g})")


def dense_lead_layers(e):
    """A dense lead layer (DeepSeek's first_k_dense_replace, leading_dense_block_count) computed as a mixture of
    experts: its feed-forward re-run as the first routed layer's."""
    cfg = e.cfg
    if e.stage != "ffn_out" or cfg is None or e.model is None or e.layer is None or cfg.is_moe(e.layer):
        return
    L = next((i for i in range(cfg.n_layer) if cfg.is_moe(i)), None)
    x = _stages(e.bad_dump, [f"ffn_norm-{e.layer}"], e.positions) or _stages(e.ref, [f"ffn_norm-{e.layer}"],
                                                                             e.positions)
    if L is None or not x:
        return
    from ..arch import blocks

    routed = to_numpy(blocks.feed_forward(x[0].astype(np.float32), e.model.weights["layers"][L], cfg, e.model.ops, L))
    if e.close(routed, e.bad):
        dense = sum(not cfg.is_moe(i) for i in range(cfg.n_layer))
        yield (f"hint: matches layer {e.layer}'s input through layer {L}'s experts: this model's first {dense} "
               "layers are dense (leading_dense_block_count, first_k_dense_replace), their feed-forward "
               "ffn_gate/ffn_up/ffn_down")


def latent_rope(e):
    """Latent attention's RoPE (DeepSeek's q_pe and k_pe): re-run from the side's own q or kv_cmpr_pe in the other
    pair layout, or on the other end of the head (q_nope's first dims for q_pe, the latent's for k_pe)."""
    cfg = e.cfg
    if e.stage not in ("q_pe", "k_pe") or cfg is None or not cfg.kv_lora_rank or e.model is None:
        return
    source = "q" if e.stage == "q_pe" else "kv_cmpr_pe"
    x = _stages(e.bad_dump, [f"{source}-{e.layer}"], e.positions) or _stages(e.ref, [f"{source}-{e.layer}"],
                                                                             e.positions)
    if not x:
        return
    x, R, own = x[0].astype(np.float32), cfg.rope_dim, cfg.rope_layout
    x = x if e.stage == "q_pe" else x[:, None]  # [T, n, width]
    cos, sin = _rope_tables(e, False)
    other = _other_layout(cfg)
    pairs = {"interleaved": "adjacent pairs (2i, 2i+1)", "half": "pairs (i, i + R/2)"}
    if e.close(ROPE[other](x[..., -R:], cos, sin), e.bad):
        yield (f"hint: matches {e.stage} rotated in {pairs[other]}: this model rotates {pairs[own]} (llama.cpp's "
               f"deepseek2 graph, transformers' rope_interleave {'true' if own == 'interleaved' else 'false'})")
    elif e.close(ROPE[own](x[..., :R], cos, sin), e.bad):
        part = "q_nope's" if e.stage == "q_pe" else "the latent's"
        yield (f"hint: matches RoPE of {source}'s first {R} dims ({part}): the rotated part is its last {R} dims "
               f"(qk_rope_head_dim), after {x.shape[-1] - R}")


class Hint(NamedTuple):
    """A registered hint: the detector, where it applies, and the bug it names (as a function that injects it)."""

    detect: Callable  # Evidence -> its lines, none where the evidence does not fit
    stages: tuple | None  # the stages it looks at (None: any)
    bugs: Callable | tuple  # refllama.check.bugs: the bugs it names, each injected into a correct dump by
    # tests/test_hints.py, which requires this hint alone to fire on each
    when: Callable = None  # ModelConfig -> whether the family has what it checks (None: any family)
    reads: tuple = ()  # other stages of the layer it needs, in MINE's dump or REF's
    model: bool = False  # it re-runs part of the model: only with the model's weights
    unless: tuple = ()  # the hints it gives way to
    fallback: bool = False  # speaks only where no other hint does

    @property
    def name(self):
        return self.detect.__name__


def _moe(cfg):
    return bool(cfg.n_expert)


def _oai(cfg):  # gpt-oss's mixture: its router, its biased experts, its clamped SwiGLU
    return cfg.expert_gating == "softmax_weight" or bool(cfg.oai_swiglu)


def _linear(cfg):
    return bool(cfg.recurrent_layers and any(cfg.recurrent_layers))


ROPED, NORMED = ("Qcur_rope", "Kcur_rope"), ("attn_norm", "ffn_norm", "result_norm", "attn_post_norm", "ffn_post_norm")
HINTS = (  # in the order their lines are listed
    Hint(nope_layers, ("Qcur_rope", "Kcur_rope", "kq"), bugs.rope_not_skipped_on_nope_layers, model=True,
         when=lambda c: c.nope_layers is not None),
    Hint(attention_softcap, ("kq_scaled_2", "kq_soft_max"),
         (bugs.attention_not_soft_capped, bugs.soft_cap_before_scale), reads=("kq",),
         when=lambda c: bool(c.attn_softcap)),
    Hint(pre_norm_where_none, ("Qcur", "Kcur", "Vcur", "ffn_gate", "ffn_up"), bugs.pre_norm_where_none, model=True,
         when=lambda c: c.arch == "olmo2"),
    Hint(granite_multipliers, ("ffn_inp", "l_out", "result_output"),
         (bugs.residual_multiplier_dropped, bugs.embedding_multiplier_dropped, bugs.logits_not_scaled), model=True,
         when=lambda c: c.arch == "granite"),
    Hint(rope_frequencies, ROPED, (bugs.rope_positions_from_1, bugs.rope_base_wrong), model=True,
         unless=("nope_layers",)),
    Hint(other_pair_layout, archs.QK_STAGES,
         (bugs.manifest_names_the_other_layout, bugs.q_k_rows_in_the_other_layout)),
    Hint(permuted_heads, archs.QK_STAGES + ("Vcur", "kqv_out"), bugs.heads_permuted),
    Hint(qk_norm_variants, ("Qcur_normed", "Kcur_normed"), (bugs.q_norm_skipped, bugs.k_norm_over_the_whole_row),
         model=True),
    Hint(routing_choice, ("ffn_moe_topk",), (bugs.expert_ids_plus_1, bugs.one_token_routed_elsewhere), when=_moe,
         unless=("least_probable_experts", "scored_router")),
    Hint(routing_weights, ("ffn_moe_logits", "ffn_moe_probs", "ffn_moe_weights", "ffn_moe_weights_norm",
                           "ffn_moe_weighted", "ffn_moe_out"),
         (bugs.sigmoid_router, bugs.renormalised_where_kept, bugs.decode_step_not_renormalised), when=_moe),
    Hint(permuted_slot_weights, ("ffn_moe_weights", "ffn_moe_weighted"), bugs.weights_on_other_slots, when=_moe),
    Hint(router_input, ("ffn_moe_logits",), bugs.router_reads_the_residual, model=True, when=_moe),
    Hint(least_probable_experts, ("ffn_moe_topk",), bugs.least_probable_experts, reads=("ffn_moe_probs",),
         when=_moe),
    Hint(shared_gate_without_sigmoid, ("ffn_shexp_gate", "ffn_shexp_out", "ffn_out"), bugs.shared_gate_without_sigmoid,
         reads=("ffn_shexp_gate_inp",), when=lambda c: bool(c.n_ff_shexp)),
    Hint(missing_shared_expert, ("ffn_out", "l_out"), (bugs.shared_expert_left_out, bugs.shared_expert_ungated,
                                                        bugs.shared_experts_left_out),
         when=lambda c: bool(c.n_ff_shexp)),
    Hint(shifted_experts, ("ffn_moe_gate", "ffn_moe_up"), bugs.neighbour_experts, reads=("ffn_norm", "ffn_moe_topk"),
         model=True, when=_moe),
    Hint(skipped_norm, NORMED, (bugs.ffn_norm_skipped, bugs.norm_weight_not_applied), model=True),
    Hint(missing_residual, tuple(RESIDUAL_SUMS), (bugs.residual_dropped, bugs.attention_output_not_added),
         unless=("granite_multipliers", "missing_shared_expert")),
    Hint(another_kv_head_mapping, ("kq",), bugs.kv_heads_modulo, reads=("Qcur_rope", "Kcur_rope"),
         when=lambda c: c.n_head != c.n_head_kv),
    Hint(another_activation, tuple(GATED), bugs.relu_for_silu),
    Hint(another_softmax_scale, ("kq_soft_max",), (bugs.softmax_scale_1_over_hd, bugs.softmax_scale_without_mscale),
         reads=("kq",)),
    Hint(another_norm_eps, ("attn_norm", "ffn_norm", "result_norm"), bugs.norm_eps_wrong,
         unless=("missing_embedding_scale",)),  # RMSNorm of x / s is RMSNorm of x with eps s^2 eps
    Hint(rope_on_the_wrong_pairs, ROPED, bugs.rope_on_the_wrong_pairs, model=True),
    Hint(tied_output_head, ("result_output",), bugs.output_head_tied, reads=("result_norm",), model=True),
    Hint(skipped_post_norm, ("sa_out", "ffn_inp", "l_out"), bugs.post_norm_skipped,
         when=lambda c: "attn_post_norm" in archs.get(c.arch).STAGES),
    Hint(norm_weight_without_one, NORMED + ("Qcur_normed", "Kcur_normed"), bugs.norm_weight_without_one, model=True),
    Hint(missing_embedding_scale, ("attn_norm",), bugs.embeddings_unscaled, reads=("inp_embd",), model=True),
    Hint(swapped_rope_bases, ROPED, bugs.rope_local_base_for_global, model=True, unless=("rope_frequencies",),
         when=lambda c: bool(c.rope_base_swa)),
    Hint(sliding_window, ("kq_soft_max",), (bugs.window_not_applied, bugs.window_one_key_wide,
                                            bugs.window_on_the_other_layers), reads=("kq",),
         unless=("attention_softcap", "another_softmax_scale"), when=lambda c: bool(c.sliding_window)),
    Hint(learned_positions, ("pos_embd", "inpL"), (bugs.position_embeddings_not_added, bugs.position_rows_plus_1),
         model=True, when=lambda c: "pos_embd" in archs.get(c.arch).INPUTS),
    Hint(missing_softcap, ("result_output",), bugs.logits_not_soft_capped, reads=("result_norm",), model=True,
         when=lambda c: bool(c.logit_softcap)),
    Hint(mask_off_by_one, ("kq_soft_max",), bugs.mask_one_key_late, reads=("kq",),
         unless=("attention_softcap", "another_softmax_scale", "sliding_window")),
    Hint(missing_mask, ("kq_soft_max",), bugs.no_causal_mask, reads=("kq",)),
    Hint(linear_decay, ("gate",), bugs.decay_from_a_log_as_stored, model=True, when=_linear),
    Hint(decay_without_dt_bias, ("a_softplus",), bugs.dt_bias_missing, when=_linear),
    Hint(conv_state, ("conv_output_raw",), (bugs.conv_state_not_carried, bugs.conv_kernel_reversed), model=True,
         when=_linear),
    Hint(qk_not_l2_normed, ("q_conv_predelta", "k_conv_predelta"), bugs.qk_not_l2_normed, when=_linear),
    Hint(gated_norm_order, ("final_output",), bugs.gated_norm_in_the_other_order, model=True, when=_linear),
    Hint(v_head_order, tuple(V_HEAD_STAGES), bugs.v_heads_in_the_other_order,
         when=lambda c: c.linear_v_heads > c.linear_k_heads),
    Hint(beta_without_sigmoid, ("beta_sigmoid",), bugs.beta_without_sigmoid, when=_linear),
    Hint(attention_output_gate, ("attn_gated",), bugs.attention_output_gate_missing, when=_linear),
    Hint(partial_rope, ROPED, bugs.rope_over_every_dim, model=True, when=lambda c: 0 < c.rope_dim < c.head_dim),
    Hint(scored_router, ("ffn_moe_probs", "ffn_moe_weights", "ffn_moe_topk", "ffn_moe_weights_scaled",
                         "ffn_moe_weighted", "ffn_moe_out"),
         (bugs.softmax_for_sigmoid, bugs.selection_bias_on_the_weights, bugs.selection_bias_not_chosen_by,
          bugs.expert_groups_ignored, bugs.routed_scaling_dropped), when=lambda c: c.expert_gating == "sigmoid"),
    Hint(dense_lead_layers, ("ffn_out",), bugs.dense_layer_routed, model=True,
         when=lambda c: bool(c.n_expert) and not c.is_moe(0)),
    Hint(latent_rope, ("q_pe", "k_pe"), (bugs.q_pe_in_the_other_pairs, bugs.k_pe_from_the_latents_dims), model=True,
         when=lambda c: bool(c.kv_lora_rank)),
    Hint(attention_sinks, ("kq_soft_max",), (bugs.sinks_missing, bugs.sinks_in_the_numerator), reads=("kq",),
         model=True),
    Hint(oai_router, ("ffn_moe_probs", "ffn_moe_weights_softmax"),
         (bugs.router_bias_missing, bugs.softmax_over_every_expert), reads=("ffn_moe_logits",), when=_oai),
    Hint(clamped_swiglu, ("ffn_moe_swiglu_oai",), (bugs.swiglu_clamp_missing, bugs.swiglu_alpha_1), when=_oai),
    Hint(expert_biases, (*EXPERT_BIASED, *EXPERT_PRODUCTS), (bugs.expert_biases_missing, bugs.experts_dumped_biased),
         model=True, when=_oai),
    Hint(rounded, None, bugs.rounded_to_bfloat16),
    Hint(scale_factor, None, bugs.scaled, fallback=True),
    Hint(sign_flip, None, bugs.signs_flipped, fallback=True),
    Hint(another_stage, None, bugs.gate_read_for_up, fallback=True),
    Hint(one_vector_added, tuple(BIASES), bugs.bias_dropped, fallback=True),
    Hint(float16_cache, ("kq", "kqv_out"), bugs.kv_cache_in_float16, fallback=True),
    Hint(neighbour_layer, (*BIASES, *NORMS), bugs.attn_norm_with_neighbours_weight, model=True, fallback=True),
    Hint(decode_path, None, bugs.decode_step_position_plus_1, fallback=True),
    Hint(later_positions, None, bugs.later_positions_off, fallback=True),
)


def applies(hint, stage, layer, cfg, model, dumps):
    """Whether `hint` looks at this stage of this family, with what it needs at hand."""
    if hint.stages is not None and stage not in hint.stages or hint.model and model is None:
        return False
    if hint.when is not None and (cfg is None or not hint.when(cfg)):
        return False
    names = [r if layer is None or r in INPUT_STAGES else f"{r}-{layer}" for r in hint.reads]
    return all(any(d is not None and n in d for d in dumps) for n in names)


def hints(stage, layer, positions, bad, want, tol, bad_dump, good, model, ref=None):
    """[(hint name, line)]: the usual signatures of a bug at the first diverging stage, one registered hint each."""
    valid = visible(stage, positions, want.shape)
    valid = np.ones(want.shape, bool) if valid is None else valid
    cfg = model.config if model else None
    e = Evidence(stage, layer, positions, bad, want, valid, bad[valid].astype(np.float64),
                 want[valid].astype(np.float64), tol[1] if tol else 1e-8, cfg, model, bad_dump, good, ref)
    live = {h.name: h for h in HINTS if applies(h, stage, layer, cfg, model, (bad_dump, good, ref))}
    said = {}

    def lines(name):  # the hint's lines, once; none where a hint it gives way to speaks
        if name not in said:
            h = live.get(name)
            said[name] = [] if h is None or any(lines(u) for u in h.unless) else list(h.detect(e))
        return said[name]

    found = [(n, line) for n, h in live.items() if not h.fallback for line in lines(n)]
    return found or [(n, line) for n, h in live.items() if h.fallback for line in lines(n)]
