"""Compare two checkpoint dumps stage by stage and name the first stage, in forward order, that adds error.

    python -m refllama.compare MINE REF [-m MODEL] [--numerics bfloat16] [--json] [--plot errors.png]
    python -m refllama.compare --logits MINE REF

MINE is the dump checked, REF the reference: directories or .safetensors files in the format of
checkpoints/FORMAT.md, of the same token ids. Per stage: the error end to end (MINE against REF) beside the
error of the stage before it, and, when the model is at hand, each side's local error: refllama re-runs the
stage on that side's own inputs, so a stage that adds error is told apart from one that only carries it.
Exit code 0: every stage within tolerance; 1: a stage diverged; 2: an input could not be read.
"""

import argparse
import json
import os
import sys
from typing import NamedTuple

import numpy as np

from . import arch as archs
from .dump import PRODUCER_NUMERICS, Dump, forward_order, known_stages, model_sha256, split_name, stack_records
from .errors import RefllamaError
from .ggml_tables import round_f16
from .layers import ROPE, silu
from .tolerances import REFERENCE_KINDS, UNIT_ROUNDOFF, band
from .trace import recording, stage_name
from .xp import to_numpy

COLUMNS = (*REFERENCE_KINDS, *UNIT_ROUNDOFF)
COARSENESS = ("float32", "float16", "bfloat16", "ggml")  # a pair is judged by its coarser side's arithmetic
ATTENTION = ("kq", "kq_soft_max")  # [H, T, S]: only the keys a query sees are compared


class Column(NamedTuple):
    """The tolerance column for a pair, and why it was chosen."""
    name: str
    why: str

    def local(self, stage):  # a stage re-run on one side's own inputs
        return band(self.name, stage)

    def e2e(self, stage):  # MINE against REF
        return band(self.name, stage, end_to_end=True)


def choose_column(mine, ref, override=None):
    """The bands that fit the pair, from both dumps' numerics (declared, or implied by the producer)."""
    if override:
        return Column(override, "set by --tolerance")
    sides = f"MINE {mine.numerics}, REF {ref.numerics}"
    if mine.numerics == ref.numerics == "ggml":
        return Column("ggml", f"{sides}: both compute llama.cpp's CPU arithmetic, equal to float32 rounding")
    coarse = max(mine.numerics, ref.numerics, key=COARSENESS.index)
    if coarse == "ggml":
        return Column("llama.cpp", f"{sides}: llama.cpp's 8-bit activations and f16 KV cache")
    if coarse in UNIT_ROUNDOFF:
        return Column(coarse, f"{sides}: bands of {coarse}'s rounding for each stage re-run on its own inputs")
    return Column("float32", f"{sides}: two float32 engines on the same weights")


def within(m, tol):
    return tol is None or (m["max_rel"] <= tol[0] and m["nmse"] <= tol[1])


def metrics(a, b, valid=None):
    """Errors of a against the reference b (same shape), over the entries `valid` marks (default: all)."""
    if valid is not None:
        a, b = a[valid], b[valid]
    a, b = a.astype(np.float64), b.astype(np.float64)
    if a.size == 0:
        return {"max_abs": 0.0, "max_rel": 0.0, "nmse": 0.0, "cosine": 1.0}
    diff = a - b
    span = float(b.max() - b.min()) or float(np.abs(b).max()) or 1.0
    norm_b = float(np.sum(b ** 2))
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    return {"max_abs": float(np.abs(diff).max()), "max_rel": float(np.abs(diff).max()) / span,
            "nmse": float(np.sum(diff ** 2)) / norm_b if norm_b else float(np.sum(diff ** 2)),
            "cosine": float(np.sum(a * b)) / denom if denom else 1.0}


def visible(stage, positions, shape):
    """For kq and kq_soft_max [H, P, S]: the keys each query position sees (k <= p); None for other stages."""
    if stage not in ATTENTION:
        return None
    return np.broadcast_to((np.arange(shape[-1])[None, :] <= np.asarray(positions)[:, None])[None], shape)


def take(dump_or_trace, name, positions):
    """Rows of `name` at `positions` (each one it holds), along the stage's token axis; kq and kq_soft_max
    cut to the keys the last of them sees."""
    stored = dump_or_trace.positions(name)
    index = {p: i for i, p in enumerate(stored)}
    a = np.take(dump_or_trace[name], [index[p] for p in positions], axis=dump_or_trace.token_axis(name))
    if split_name(name)[0] in ATTENTION:
        a = a[..., :max(positions) + 1]
        if a.shape[-1] <= max(positions):
            raise RefllamaError(f"stage '{name}': {a.shape[-1]} keys stored, position {max(positions)} sees more")
    return a


# ---- re-running stages on a dump's own inputs

class Forced:
    """refllama's value of every stage when each stage a dump holds is replaced by the dump's value as the
    forward pass goes: a stage's value here is computed from the dump's own inputs (its local check)."""

    def __init__(self, model, dump):
        self.model, self.dump, self.start, self.parts = model, dump, 0, {}
        self.records = {n: dump.rows(n) for n in dump.names}
        model.cache.reset()
        for ids, start in [(dump.prompt_ids, 0)] + [([t], len(dump.prompt_ids) + k)
                                                    for k, t in enumerate(dump.decode_ids)]:
            self.start, self.n = start, len(ids)
            with recording(self):
                model.forward(ids, start)
        self.arrays = {n: stack_records(parts, Dump.axis_of(split_name(n)[0])) for n, parts in self.parts.items()}
        self.names = list(self.arrays)

    def record(self, name, layer, x):
        key = stage_name(name, layer)
        if key not in self.records:
            return x
        axis = Dump.axis_of(name)
        here = self.model.xp
        ours = to_numpy(x).astype(np.float32)
        self.parts.setdefault(key, []).append((list(range(self.start, self.start + self.n)), ours.copy()))
        x = here.array(x, dtype=here.float32)  # a copy to write the dump's rows into
        for positions, a in self.records[key]:
            for j, p in enumerate(positions):
                i = p - self.start
                if 0 <= i < self.n:
                    row = np.take(a, j, axis=axis)
                    if axis == 1:  # [H, S]: only the keys position p sees (an engine may leave the rest unset)
                        x[:, i, :p + 1] = here.asarray(row[:, :p + 1])
                    else:
                        x[i] = here.asarray(row)
        return x

    def __contains__(self, name):
        return name in self.arrays

    def __getitem__(self, name):
        return self.arrays[name][0]

    def positions(self, name):
        return self.arrays[name][1]

    def token_axis(self, name):
        return Dump.axis_of(split_name(name)[0])


def find_model(path, mine, ref, numerics=None):
    """The model both dumps ran (its sha256 is the one they record): `path`, else a `model_path` they give, else
    the installed SmolLM2. None, with the reason, when none is found. It re-runs stages in numerics "ggml" when
    both dumps compute llama.cpp's arithmetic (MINE's as `numerics` says, if given), else in float32."""
    from . import api

    want = {str(d.manifest.get("model_sha256") or "") for d in (ref, mine)} - {""}
    candidates = [path] if path else [d.manifest.get("model_path") for d in (ref, mine)]
    if not path:
        try:
            candidates.append(api.default_model_path())
        except RefllamaError:
            pass
    for c in dict.fromkeys(c for c in candidates if c and os.path.exists(c)):
        if path or not want or model_sha256(c) in want:
            n_ctx = max(len(ref.token_ids), len(mine.token_ids), 256, int(ref.manifest.get("n_ctx") or 0))
            both_ggml = (numerics or mine.numerics) == ref.numerics == "ggml" and not os.path.isdir(c)
            return api.load(c, n_ctx=n_ctx, numerics="ggml" if both_ggml else "float32"), None
    return None, "no model with the dumps' sha256 found (give -m MODEL)"


# ---- the comparison

def compare(mine_path, ref_path, model=None, column=None, numerics=None):
    """A Report: per stage both dumps hold, in forward order, the end-to-end error and each side's local error;
    the first stage that adds error; where it sits and what it looks like."""
    layout, head_dim = (model.config.rope_layout, model.config.head_dim) if model else (None, None)
    ref = Dump(ref_path, layout=layout, head_dim=head_dim)  # no model: q/k in REF's own layout
    mine = Dump(mine_path, layout=ref.want_layout, head_dim=head_dim)
    if numerics:
        mine.numerics = numerics
    if mine.prompt_ids != ref.prompt_ids:
        raise RefllamaError("the dumps are of different token ids; compare runs of the same tokens "
                            "(python -m refllama.run --dump-dir REF --tokens-from MINE makes refllama's)")
    col = choose_column(mine, ref, column)
    forced, notes = {}, []
    if model is not None:
        sha = model_sha256(model.path)
        for side, d in (("MINE", mine), ("REF", ref)):
            if d.manifest.get("model_sha256") and d.manifest["model_sha256"] != sha:
                notes.append(f"{side} ran another model (sha256 differs from {os.path.basename(model.path)}): "
                             "its stages are not re-run")
            else:
                forced[side] = Forced(model, d)
    same = len(os.path.commonprefix([mine.token_ids, ref.token_ids]))  # positions with the same history
    if same < min(len(mine.token_ids), len(ref.token_ids)):
        notes.append(f"the decode tokens differ from position {same}: positions >= {same} are not compared")
    arch = archs.ARCHITECTURES.get(ref.arch, archs.llama)
    rows, first, previous = [], None, None
    for name in forward_order([n for n in ref.names if n in mine], arch.STAGES):
        stage, layer = split_name(name)
        positions = sorted(p for p in set(mine.positions(name)) & set(ref.positions(name)) if p < same)
        if not positions:
            continue
        a, b = take(mine, name, positions), take(ref, name, positions)
        if a.shape != b.shape:
            raise RefllamaError(f"stage '{name}': shapes differ, {list(a.shape)} in MINE vs {list(b.shape)} in REF")
        row = {"name": name, "stage": stage, "layer": layer, "positions": positions,
               **metrics(a, b, visible(stage, positions, b.shape))}
        row["tol"] = col.e2e(stage)
        row["input_nmse"] = previous["nmse"] if previous else None  # the stage before it in forward order
        for side, d in (("MINE", mine), ("REF", ref)):
            f = forced.get(side)
            if f is not None and name in f:
                own = [p for p in d.positions(name) if p in set(f.positions(name))]
                x, y = take(d, name, own), take(f, name, own)
                row[f"local_{side}"] = metrics(x, y, visible(stage, own, y.shape))
        local_tol = col.local(stage)
        adds = [s for s in ("MINE", "REF") if f"local_{s}" in row and not within(row[f"local_{s}"], local_tol)]
        row["local_tol"] = local_tol
        row["adds"] = adds
        both_local = all(f"local_{s}" in row for s in ("MINE", "REF"))
        e2e_ok = within(row, row["tol"])
        row["ok"] = not adds and (both_local or e2e_ok)
        row["carried"] = not e2e_ok and row["ok"]
        rows.append(row)
        previous = row
        if first is None and not row["ok"]:
            first = row
    report = Report(rows, first, col, notes, coverage(mine, ref), [], [])
    if first is not None:
        diagnose(report, mine, ref, forced, model)
    return report


class Report(NamedTuple):
    rows: list
    first: dict
    column: Column
    notes: list
    coverage: list
    where: list  # lines: how the first divergence's error spreads over positions, heads, channels
    hints: list  # lines: what its error looks like


def coverage(mine, ref):
    """Lines for the summary: layers and stages compared, names in one dump only, names no architecture knows
    (with the closest known one, so a misspelling is seen)."""
    import difflib

    both = [n for n in ref.names if n in mine]
    layers = sorted({split_name(n)[1] for n in both} - {None})
    decode = sorted({p for n in both for p in mine.positions(n)} & {p for n in both for p in ref.positions(n)}
                    - set(range(len(ref.prompt_ids))))
    lines = [f"compared: {len(both)} stages in {len(layers)} layers ({_spans(layers)})"
             + (f", decode positions {_spans(decode)}" if decode else "")]
    for who, d, other in (("only in MINE", mine, ref), ("only in REF", ref, mine)):
        alone = [n for n in d.names if n not in other]
        if alone:
            lines.append(f"{who}: {len(alone)} ({', '.join(alone[:6])}{', ...' if len(alone) > 6 else ''})")
    known = known_stages(ref.arch)
    for n in dict.fromkeys([*mine.names, *ref.names]):
        stage = split_name(n)[0]
        if stage not in known:
            close = difflib.get_close_matches(stage, known, n=1)
            lines.append(f"unknown stage '{n}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    return lines


def _spans(numbers):  # [0, 1, 2, 5] -> "0-2, 5"
    spans, start = [], None
    for i, n in enumerate(numbers):
        start = n if start is None else start
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            spans.append(f"{start}-{n}" if n > start else f"{n}")
            start = None
    return ", ".join(spans) or "none"


# ---- where the error sits and what it looks like

def diagnose(report, mine, ref, forced, model):
    """Fill report.where and report.hints for the first divergence: the side that adds error against refllama's
    re-run of that stage on the same inputs, or MINE against REF when nothing could be re-run."""
    r = report.first
    name, stage, layer = r["name"], r["stage"], r["layer"]
    side = r["adds"][0] if r["adds"] else None
    bad_dump = ref if side == "REF" else mine
    good = forced[side] if side else ref
    positions = [p for p in bad_dump.positions(name) if p in set(good.positions(name))]
    bad, want = take(bad_dump, name, positions), take(good, name, positions)
    tol = report.column.local(stage) if side else report.column.e2e(stage)
    cfg = model.config if model else None
    against = f"refllama re-run on {side}'s inputs" if side else "REF"
    report.where.append(f"{side or 'MINE'} against {against}:")
    report.where.extend(breakdown(stage, positions, bad, want, tol, cfg))
    report.hints.extend(hints(stage, layer, positions, bad, want, tol, bad_dump, good, model))


def _error_by(diff, scale, axis):
    """Mean squared error of each slice along `axis`, over `scale` (the whole reference's mean square)."""
    other = tuple(i for i in range(diff.ndim) if i != axis)
    return np.nanmean(diff ** 2, axis=other) / scale


def breakdown(stage, positions, bad, want, tol, cfg):
    """Lines: which positions, heads and channels are wrong."""
    valid = visible(stage, positions, want.shape)
    diff = np.where(True if valid is None else valid, bad.astype(np.float64) - want, np.nan)
    scale = float(np.nanmean(np.where(True if valid is None else valid, want.astype(np.float64), np.nan) ** 2)) or 1.0
    exact = tol[1] if tol else 1e-8
    lines = []

    def split(label, errors, names):
        ok = [names[i] for i, e in enumerate(errors) if e <= exact]
        wrong = [names[i] for i, e in enumerate(errors) if not e <= exact]
        if ok and wrong:
            lines.append(f"  by {label}: exact at {_spans(ok)}; wrong at {_spans(wrong)}")
        elif wrong:
            lines.append(f"  by {label}: wrong at every one ({len(wrong)})")
        return ok, wrong

    split("position", _error_by(diff, scale, Dump.axis_of(stage)), positions)
    heads = _heads(stage, diff, cfg)
    if heads is not None:
        axis = 0 if stage in ATTENTION else 1
        n = heads.shape[axis]
        ok, wrong = split("head", _error_by(heads, scale, axis), list(range(n)))
        kvh = cfg.n_head_kv if cfg else None
        if ok and wrong and kvh and stage not in ("Kcur", "Kcur_normed", "Kcur_rope", "Vcur") and n != kvh:
            group = n // kvh
            if ok == [h for h in range(n) if h // group == h % kvh]:
                lines.append(f"hint: exactly the heads h with h // {group} == h % {kvh} are right: query head h "
                             f"must read kv head h // {group} (grouped-query attention), not h % {kvh}")
    if diff.ndim == 2:
        per = np.nansum(diff ** 2, axis=0)
        total = float(per.sum()) or 1.0
        top = np.argsort(per)[::-1][:8]
        share = float(per[top].sum()) / total
        if share > 0.5 and len(per) > 16:
            lines.append(f"  by channel: {share:.0%} of the error in channels {', '.join(map(str, sorted(top)))} "
                         f"of {len(per)}")
        else:
            lines.append(f"  by channel: spread over the {len(per)} channels")
    return lines


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

    def close(self, x, y):
        return metrics(x, y)["nmse"] <= self.exact

    def inputs(self):
        return _inputs_of(self.stage, self.layer, self.bad_dump, self.positions, self.cfg)


def scale_factor(e, found):
    if e.w.any():
        c = float(e.b @ e.w / (e.w @ e.w))
        if abs(c - 1) > 1e-3 and e.close(e.b, c * e.w):
            yield (f"hint: {c:.6g} x the expected values (1/{1 / c:.6g}): a scale factor"
                    + (" (a sign flip)" if abs(c + 1) < 1e-3 else ""))


def sign_flip(e, found):
    flipped = np.mean((np.sign(e.b) != np.sign(e.w)) & np.isclose(np.abs(e.b), np.abs(e.w), rtol=1e-3, atol=0)
                      & (np.abs(e.w) > 1e-6 * np.abs(e.w).max())) if e.w.any() else 0
    if 0.05 < flipped and not found:
        yield f"hint: {flipped:.0%} of the values have the expected magnitude and the opposite sign"


def other_pair_layout(e, found):
    if e.stage in archs.QK_STAGES and e.cfg is not None:
        other = _other_layout(e.cfg)
        if e.close(archs.permute_qk(e.bad, other, e.cfg.rope_dim), e.want):
            yield (f"hint: equal after converting q/k to the '{other}' pair layout: the manifest's qk_layout is "
                    "wrong, or the weights' rows are permuted")


def permuted_heads(e, found):
    heads = _heads(e.stage, e.bad, e.cfg)
    if heads is not None and e.stage not in ATTENTION:
        wh = _heads(e.stage, e.want, e.cfg)
        n = heads.shape[1]
        match = [next((g for g in range(n) if e.close(heads[:, h], wh[:, g])), None) for h in range(n)]
        if None not in match and match != list(range(n)):
            yield f"hint: equal up to a permutation of heads: head h holds the expected head {match}[h]"


def another_stage(e, found):
    if e.layer is None or e.good is None:
        return
    for name in e.good.names:
        stage, layer = split_name(name)
        if layer == e.layer and stage != e.stage and set(e.positions) <= set(e.good.positions(name)):
            o = take(e.good, name, e.positions)
            if o.shape == e.bad.shape and e.close(e.bad, o):
                yield f"hint: equals the expected {name}: the two are swapped, or read from one another's weights"


def another_activation(e, found):
    inputs = e.inputs() if e.stage in GATED else None
    if inputs:
        gate, up = inputs
        err = {label: metrics(f(gate) * up, e.bad)["nmse"] for label, f in ACTIVATIONS.items()
               if label != GATED[e.stage]}
        best = min(err, key=err.get)
        if err[best] <= e.exact:
            yield f"hint: matches {best}(ffn_gate) * ffn_up; the model's is {GATED[e.stage]}"


def another_softmax_scale(e, found):
    inputs = e.inputs() if e.stage == "kq_soft_max" and e.cfg is not None else None
    if inputs:
        (kq,) = inputs
        mask = np.where(visible(e.stage, e.positions, kq.shape), 0.0, -np.inf)
        hd, scale = e.cfg.head_dim, e.cfg.kq_scale
        for label, s in (("1/HD", 1 / hd), ("1 (no scale)", 1.0), ("1/sqrt(HD)", hd ** -0.5)):
            p = _softmax(np.nan_to_num(kq) * s + mask)
            if e.close(p[e.valid], e.b) and s != scale:
                yield f"hint: matches softmax(kq * {label}); the model's scale is {scale:.4g}"


def another_norm_eps(e, found):
    inputs = e.inputs() if e.stage in ("attn_norm", "ffn_norm", "result_norm") and e.cfg is not None else None
    if inputs:
        (x,) = inputs
        ms = np.mean(x.astype(np.float64) ** 2, axis=-1)
        ratio = np.median(np.abs(e.want) / np.maximum(np.abs(e.bad), 1e-30), axis=-1) ** 2  # (ms + eps') / (ms + eps)
        eps = ratio * (ms + e.cfg.rms_eps) - ms
        if np.all(np.abs(ratio - 1) > 1e-7) and np.ptp(eps) <= 0.1 * abs(np.median(eps)) + 1e-12:
            yield f"hint: matches an RMS norm with eps {np.median(eps):.3g}; the model's is {e.cfg.rms_eps:g}"


def rope_on_the_wrong_pairs(e, found):
    inputs = e.inputs() if e.stage in ("Qcur_rope", "Kcur_rope") and e.cfg is not None else None
    if inputs and e.model is not None:
        cfg, other = e.cfg, _other_layout(e.cfg)
        cos, sin = (to_numpy(t)[e.positions] for t in (e.model.cache.cos, e.model.cache.sin))
        held_other = archs.permute_qk(inputs[0].astype(np.float32), other, cfg.rope_dim)  # q/k in the other order
        swapped = archs.permute_qk(ROPE[cfg.rope_layout](held_other, cos, sin), cfg.rope_layout, cfg.rope_dim)
        if e.close(swapped, e.bad):
            yield ("hint: matches RoPE rotating the wrong pairs: (2i, 2i+1) where the q/k order pairs (i, i + R/2), "
                    "or the reverse; the engine's RoPE and its q/k layout disagree")


def missing_mask(e, found):
    if e.stage == "kq_soft_max":
        future = ~visible(e.stage, e.positions, e.bad.shape)
        if np.nansum(np.abs(e.bad[future])) > 1e-3 * np.nansum(np.abs(e.bad[e.valid])):
            yield "hint: weights on keys after each query's own position: the causal mask is missing"


def rounded(e, found):
    for fmt, rounding in ROUNDINGS.items():
        if e.b.size and np.array_equal(rounding(e.b), e.b) and not np.array_equal(rounding(e.w), e.w) \
                and e.bad_dump.numerics != fmt:
            yield (f"hint: every value is a {fmt} number: rounded to {fmt} (if the engine computes in {fmt}, say so: "
                    f"manifest 'numerics', or --numerics {fmt})")
            return


def by_position(e, found):
    wrong = _error_by(np.where(e.valid, e.bad.astype(np.float64) - e.want, np.nan), float(np.mean(e.w ** 2)) or 1.0,
                      Dump.axis_of(e.stage)) > e.exact
    n_prompt = len(e.bad_dump.prompt_ids)
    decode = [p >= n_prompt for p in e.positions]
    if any(decode) and list(wrong) == decode:
        steps = _spans([p for p in e.positions if p >= n_prompt])
        yield (f"hint: the prompt's positions are right and the decode steps' ({steps}) are not: the decode path "
                "(its position, its KV cache slot, its mask)")
    elif not found and len(e.positions) > 1 and not wrong[0] and wrong[1:].all():
        yield ("hint: the first position is right and the later ones are not: something that depends on the "
                "position (RoPE's theta or positions, the mask, the KV cache)")


# the detectors, in the order their hints are listed; each sees the hints found before it (some speak only alone)
DETECTORS = (scale_factor, sign_flip, other_pair_layout, permuted_heads, another_stage, another_activation,
             another_softmax_scale, another_norm_eps, rope_on_the_wrong_pairs, missing_mask, rounded, by_position)


def hints(stage, layer, positions, bad, want, tol, bad_dump, good, model):
    """Lines naming the usual signatures of a bug at the first diverging stage, one detector each (DETECTORS)."""
    valid = visible(stage, positions, want.shape)
    valid = np.ones(want.shape, bool) if valid is None else valid
    e = Evidence(stage, layer, positions, bad, want, valid, bad[valid].astype(np.float64),
                 want[valid].astype(np.float64), tol[1] if tol else 1e-8, model.config if model else None, model,
                 bad_dump, good)
    found = []
    for detect in DETECTORS:
        found.extend(detect(e, found))
    return found


def _other_layout(cfg):
    return "half" if cfg.rope_layout == "interleaved" else "interleaved"


def _inputs_of(stage, layer, dump, positions, cfg=None):
    """The dump's own inputs of a stage whose hints need them, at `positions`, or None."""
    arch = archs.get(cfg.arch) if cfg is not None else archs.llama
    q = "Qcur_normed" if "Qcur_normed" in arch.STAGES else "Qcur"
    residual = "sa_out" if "sa_out" in arch.STAGES else "ffn_inp"  # the feed-forward's input (Gemma 3: sa_out)
    gate_up = [f"ffn_gate-{layer}", f"ffn_up-{layer}"]
    names = {"ffn_swiglu": gate_up, "ffn_geglu": gate_up, "kq_soft_max": [f"kq-{layer}"],
             "attn_norm": [arch.INPUTS[-1] if layer == 0 else f"l_out-{(layer or 0) - 1}"],
             "ffn_norm": [f"{residual}-{layer}"],
             "Qcur_rope": [f"{q}-{layer}"], "Kcur_rope": [f"K{q[1:]}-{layer}"]}.get(stage)
    if not names or not all(n in dump and set(positions) <= set(dump.positions(n)) for n in names):
        return None
    return [take(dump, n, positions).astype(np.float64) for n in names]


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _gelu(x):
    from math import erf

    return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))


def _bfloat16(x):
    b = np.asarray(x, np.float32).view(np.uint32)
    return ((b.astype(np.uint64) + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


ROUNDINGS = {"bfloat16": _bfloat16, "float16": lambda x: round_f16(np.asarray(x, np.float32))}
GATED = {"ffn_swiglu": "silu", "ffn_geglu": "gelu_tanh"}  # a gated unit's stage: the activation of its gate
ACTIVATIONS = {  # what engines put where a gated unit's activation belongs
    "silu": silu,
    "gelu": _gelu,
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))),
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "identity": lambda x: x,
}


# ---- a whole text: how much the logits' departure matters

def logits_verdict(mine_path, ref_path):
    """Per-token KL divergence of MINE's next-token distribution from REF's, top-1 agreement, both perplexities.
    MINE: a dump with result_output, or an .npy of [T, V] (rows: positions 0..T-1)."""
    ref = Dump(ref_path)
    if "result_output" not in ref:
        raise RefllamaError(f"{ref_path}: holds no result_output (logits)")
    if str(mine_path).endswith(".npy"):
        try:
            a = np.load(mine_path, allow_pickle=False).astype(np.float64)
        except (OSError, ValueError) as e:
            raise RefllamaError(f"{mine_path}: cannot read ({e})") from None
        a = a[0] if a.ndim == 3 and a.shape[0] == 1 else a
        if a.ndim != 2:
            raise RefllamaError(f"{mine_path}: logits must be [T, V], got {list(a.shape)}")
        mine_pos = list(range(len(a)))
    else:
        mine = Dump(mine_path)
        if "result_output" not in mine:
            raise RefllamaError(f"{mine_path}: holds no result_output (logits)")
        if mine.token_ids[:len(ref.token_ids)] != ref.token_ids[:len(mine.token_ids)]:
            raise RefllamaError("the dumps are of different token ids")
        a, mine_pos = mine["result_output"].astype(np.float64), mine.positions("result_output")
    positions = sorted(set(mine_pos) & set(ref.positions("result_output")))
    if not positions:
        raise RefllamaError("the logits share no token positions")
    b = take(ref, "result_output", positions).astype(np.float64)
    a = a[[mine_pos.index(p) for p in positions]]
    if a.shape != b.shape:
        raise RefllamaError(f"logits shapes differ: {list(a.shape)} vs {list(b.shape)}")
    la, lb = _log_softmax(a), _log_softmax(b)
    kl = np.sum(np.exp(lb) * (lb - la), axis=-1)  # KL(REF || MINE), per position
    ids = ref.token_ids
    scored = [i for i, p in enumerate(positions) if p + 1 < len(ids)]

    def nll(lp):
        return float(np.mean([-lp[i, ids[positions[i] + 1]] for i in scored])) if scored else float("nan")

    return {"positions": len(positions), "kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)),
            "kl_max": float(kl.max()), "top1": float(np.mean(a.argmax(-1) == b.argmax(-1))),
            "ppl_mine": float(np.exp(nll(la))), "ppl_ref": float(np.exp(nll(lb))), "scored": len(scored)}


def _log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


KL_SAME, KL_CLOSE, TOP1_CLOSE = 1e-4, 5e-2, 0.9  # numerics only; a quantized model's usual departure


def print_logits(v):
    print(f"positions: {v['positions']} (perplexity over the {v['scored']} with a next token)")
    print(f"KL(REF || MINE): mean {v['kl_mean']:.3e}, p99 {v['kl_p99']:.3e}, max {v['kl_max']:.3e}")
    print(f"top-1 agreement: {v['top1']:.2%}")
    print(f"perplexity: MINE {v['ppl_mine']:.4f}, REF {v['ppl_ref']:.4f}")
    print(f"verdict: {verdict(v)}")
    return 0 if close_enough(v) else 1


def close_enough(v):
    return v["kl_mean"] <= KL_CLOSE and v["top1"] >= TOP1_CLOSE


def verdict(v):
    if v["kl_mean"] <= KL_SAME and v["top1"] == 1:
        return "the same distribution (float rounding)"
    if close_enough(v):
        return "close: a departure like a quantized model's"
    return "different: look for the first divergence with a stage dump"


# ---- output

def plot(rows, path, first=None):
    """Layer x stage heatmap of log10(max_rel), on one fixed colour scale, gaps marked between layers not
    adjacent, the first divergence circled; the picture to look at first."""
    try:
        import matplotlib
    except ImportError:
        raise RefllamaError("--plot needs matplotlib: pip install 'refllama[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = list(dict.fromkeys(r["stage"] for r in rows))
    layers = sorted({r["layer"] for r in rows if r["layer"] is not None})
    labels, index = ["model"], {None: 0}
    for n in layers:
        if labels[-1] != "model" and n != int(labels[-1]) + 1:
            labels.append("...")
        index[n] = len(labels)
        labels.append(str(n))
    grid = np.full((len(labels), len(stages)), np.nan)
    for r in rows:
        grid[index[r["layer"]], stages.index(r["stage"])] = np.log10(max(r["max_rel"], 1e-8))
    fig, ax = plt.subplots(figsize=(2 + 0.45 * len(stages), 2 + 0.28 * len(labels)))
    im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=-8, vmax=0)
    ax.set_xticks(range(len(stages)), stages, rotation=60, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("stage")
    ax.set_ylabel("layer ('...': layers not compared)")
    for r in rows:
        x, y = stages.index(r["stage"]), index[r["layer"]]
        if not r["ok"]:
            ax.add_patch(plt.Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
        if first is not None and r["name"] == first["name"]:
            ax.plot(x, y, marker="*", color="white", markersize=14, markeredgecolor="black")
    fig.colorbar(im, ax=ax, label="log10(max abs error / reference range)")
    ax.set_title("error per stage (red: past tolerance; star: first divergence"
                 + (f", {first['name']})" if first else ")"))
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return labels


def print_report(rep, show_all):
    col = rep.column
    print(f"tolerance: {col.name} ({col.why})")
    for note in rep.notes:
        print(f"note: {note}")
    shown = [r for r in rep.rows if show_all or not r["ok"] or r["carried"]]
    if shown:
        print(f"{'stage':<18} {'max_rel':>9} {'nmse':>9} {'input':>9} {'MINE':>9} {'REF':>9}  verdict")
        print(f"{'':<18} {'(end to end)':>19} {'nmse':>9} {'local':>9} {'local':>9}")
    for r in shown:
        local = [f"{r[f'local_{s}']['nmse']:9.2e}" if f"local_{s}" in r else f"{'-':>9}" for s in ("MINE", "REF")]
        inp = f"{r['input_nmse']:9.2e}" if r["input_nmse"] is not None else f"{'-':>9}"
        verdict = ("adds error (" + ", ".join(r["adds"]) + ")" if r["adds"] else
                   "FAIL" if not r["ok"] else "carried from its inputs" if r["carried"] else "ok")
        pos = r["positions"]
        at = f" @{pos[0]}" if len(pos) == 1 else ""
        print(f"{r['name'] + at:<18} {r['max_rel']:9.2e} {r['nmse']:9.2e} {inp} {local[0]} {local[1]}  {verdict}")
    print("\n".join(rep.coverage))
    if rep.first is None:
        print(f"all {len(rep.rows)} stages within tolerance")
        return 0
    f = rep.first
    print("\n".join(rep.where + rep.hints))
    print(f"first divergence: {f['name']} (max_rel {f['max_rel']:.3e}, nmse {f['nmse']:.3e}"
          + (f"; added by {' and '.join(f['adds'])}" if f["adds"] else "")
          + f"; positions {_spans(f['positions'])})")
    return 1


def as_json(rep):
    keep = ("name", "stage", "layer", "positions", "max_abs", "max_rel", "nmse", "cosine", "tol", "local_tol",
            "input_nmse", "local_MINE", "local_REF", "adds", "ok", "carried")
    return {"tolerance": rep.column._asdict(), "notes": rep.notes, "coverage": rep.coverage,
            "rows": [{k: r[k] for k in keep if k in r} for r in rep.rows],
            "first_divergence": rep.first["name"] if rep.first else None, "where": rep.where, "hints": rep.hints}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m refllama.compare", description=__doc__.splitlines()[0])
    p.add_argument("mine", help="the dump checked (directory or .safetensors; with --logits also an .npy [T, V])")
    p.add_argument("ref", help="the reference dump")
    p.add_argument("-m", "--model", help="the model both ran, to re-run stages on each side's inputs (default: "
                   "the one the dumps name, or the installed SmolLM2, if its sha256 matches)")
    p.add_argument("--no-rerun", action="store_true", help="compare end to end only, without loading a model")
    p.add_argument("--numerics", choices=PRODUCER_NUMERICS,
                   help="what MINE computes in (default: its manifest's 'numerics', else float32)")
    p.add_argument("--tolerance", choices=COLUMNS, help="tolerance column (default: chosen from both dumps)")
    p.add_argument("--logits", action="store_true", help="judge the whole text by its logits: KL divergence, top-1 "
                   "agreement, perplexities")
    p.add_argument("--plot", help="write a layer x stage heatmap of the error to this PNG")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--all", action="store_true", help="print every stage, not only those past tolerance")
    args = p.parse_args(argv)
    np.seterr(all="ignore")
    try:
        if args.logits:
            v = logits_verdict(args.mine, args.ref)
            if args.json:
                print(json.dumps({**v, "verdict": verdict(v)}, indent=1))
                return 0 if close_enough(v) else 1
            return print_logits(v)
        mine, ref = Dump(args.mine), Dump(args.ref)
        model, why = (None, "--no-rerun") if args.no_rerun else find_model(args.model, mine, ref, args.numerics)
        rep = compare(args.mine, args.ref, model, args.tolerance, args.numerics)
        if model is None:
            rep.notes.append(f"stages not re-run ({why}): verdicts are end to end only")
        if args.plot:
            plot(rep.rows, args.plot, rep.first)
    except RefllamaError as e:
        print(f"refllama.compare: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(as_json(rep), indent=1))
        return 0 if rep.first is None else 1
    code = print_report(rep, args.all)
    if args.plot:
        print(f"plot written to {args.plot}")
    return code


if __name__ == "__main__":
    sys.exit(main())
