"""The comparison engine: two checkpoint dumps of the same token ids, stage by stage in forward order, each stage's
error end to end beside the error of the stage before it, and, with the model at hand, each side's local error
(refllama re-runs the stage on that side's own inputs), so that the first stage that adds error is named."""

import os
from itertools import groupby
from typing import NamedTuple

import numpy as np

from .. import arch as archs
from ..arch.blocks import IN, RESIDUAL, WIRING
from ..errors import RefllamaError
from . import references
from .diagnose import diagnose
from .dump import (
    INPUT_STAGES,
    NOT_COMPARED,
    OUTPUT_STAGES,
    SAME_VALUE,
    Dump,
    closest,
    forward_order,
    known_stages,
    latent_widths,
    model_sha256,
    split_name,
)
from .metrics import SLOT_STAGES, metrics, spans, take, visible, within
from .rerun import ROUND, Forced
from .tolerances import REFERENCE_KINDS, UNIT_ROUNDOFF, band, rounding_bands

COLUMNS = (*REFERENCE_KINDS, *UNIT_ROUNDOFF)
COARSENESS = ("float32", "float16", "bfloat16", "ggml")  # a pair is judged by its coarser side's arithmetic


class Column(NamedTuple):
    """The tolerance column for a pair, and why it was chosen; `bits`: the pair claims the same arithmetic to the
    bit, so any bit that differs is a divergence."""
    name: str
    why: str
    bits: bool = False

    def local(self, stage):  # a stage re-run on one side's own inputs
        return band(self.name, stage)

    def e2e(self, stage):  # MINE against REF
        return band(self.name, stage, end_to_end=True)


def choose_column(mine, ref, override=None):
    """The bands that fit the pair, from both dumps' numerics (declared, or implied by the producer)."""
    if override:
        return Column(override, "set by --tolerance")
    sides = f"MINE {mine.numerics}, REF {ref.numerics}"
    if mine.numerics == ref.numerics == "ggml" and mine.cpu_path and (mine.cpu_path, mine.repack) == (
            ref.cpu_path, ref.repack):
        return Column("ggml", f"{sides}: both compute llama.cpp's CPU arithmetic on the {ref.cpu_path} path"
                      f"{'' if ref.repack else ' without the repack'}, so every bit must agree", bits=True)
    if mine.numerics == ref.numerics == "ggml":
        return Column("ggml", f"{sides}: both compute llama.cpp's CPU arithmetic, equal to float32 rounding (the "
                      "dumps name no CPU path, or different ones)")
    coarse = max(mine.numerics, ref.numerics, key=COARSENESS.index)
    if coarse == "ggml":
        return Column("llama.cpp", f"{sides}: llama.cpp's 8-bit activations and f16 KV cache")
    if coarse in UNIT_ROUNDOFF:
        return Column(coarse, f"{sides}: bands of {coarse}'s rounding for each stage re-run on its own inputs")
    return Column("float32", f"{sides}: two float32 engines on the same weights")


def experts_used(mine, ref, model):
    """An error naming the side whose tokens take another number of experts than REF's (or the model's)."""
    want = model.config.n_expert_used if model is not None else None
    for name in (n for n in ref.names if split_name(n)[0] == "ffn_moe_topk"):
        k_ref = ref[name].shape[-1]
        k_mine = mine[name].shape[-1] if name in mine else k_ref
        if k_mine != k_ref or (want and k_ref != want):
            side, k = ("MINE", k_mine) if k_mine != (want or k_ref) else ("REF", k_ref)
            raise RefllamaError(f"stage '{name}': {side} routes each token to {k} experts where "
                                f"{'the model' if want else 'REF'} takes {want or k_ref}: the number of experts used "
                                "(K, expert_used_count) differs")


def untested(model, ref, same):
    """Notes on the family features the compared positions cannot test, and how to test them."""
    cfg, n = model.config, same  # positions 0 .. n - 1 are compared
    notes = []
    if cfg.sliding_window and cfg.sliding_window < cfg.n_ctx_train and n <= cfg.sliding_window:
        layers = "its local layers'" if cfg.swa_layers else "the"
        notes.append(f"untested: {layers} sliding window of {cfg.sliding_window} (every compared position sees all "
                     f"its keys): compare a prompt longer than {cfg.sliding_window} tokens (refllama.run "
                     "--dump-positions keeps such a dump small)")
    if cfg.logit_softcap and "result_output" in ref:
        peak = float(np.max(np.abs(ref["result_output"])))
        if peak < 0.5 * cfg.logit_softcap:
            notes.append(f"untested: the logits' soft-cap of {cfg.logit_softcap:g} (REF's largest |logit| is "
                         f"{peak:.3g}, where the cap bends them by under 10%): a missing or wrong cap barely shows "
                         "in these logits")
    if "rope_factors_long" in model.weights and model.n_ctx <= (cfg.rope_ctx_orig or cfg.n_ctx_train):
        notes.append(f"untested: LongRoPE's long factors (this context of {model.n_ctx} tokens takes the short ones): "
                     f"re-run both with a context above {cfg.rope_ctx_orig or cfg.n_ctx_train} (-c)")
    return notes


# ---- the comparison

def side_band(band, d, stage):  # a side's local band: its rounding's where it declares the stage rounded
    if stage not in d.rounded or band is None:
        return band
    own = rounding_bands(d.rounded[stage])
    return (max(band[0], own[0]), max(band[1], own[1]))


def rounding_note(found, stages):
    """A note proposing MINE's precision map: the stages whose every value is a float16 (bfloat16) number, which
    a float32 engine rounds; the whole numerics where every stage is."""
    if set(found) >= stages - {"ffn_moe_topk"} and len(set(found.values())) == 1:  # ids: never found
        fmt = next(iter(found.values()))
        return f'MINE\'s every stage holds {fmt} numbers only: if it computes in {fmt}, declare "numerics": "{fmt}"'
    listed = ", ".join(f'"{k}": "{v}"' for k, v in found.items())
    return (f"MINE's {', '.join(found)} hold {'/'.join(sorted(set(found.values())))} numbers only: if the engine "
            f'rounds them, declare its precision in its manifest: "rounded": {{{listed}}} (and "kv_cache": '
            '"float16" if its KV cache is float16; checkpoints/FORMAT.md)')


def readable(mine, known):
    """Refuse a dump compare can read too little of (exit 2, not a pass): names of no stage of the family (a
    misspelling, another engine's own names) while a layer they name has no stage compare can read, or while they
    outnumber those it can. Says what it read."""
    unknown = [n for n in mine.names if split_name(n)[0] not in known]
    if not unknown:
        return
    read = [n for n in mine.names if split_name(n)[0] in known]
    missing = sorted({split_name(n)[1] for n in unknown} - {split_name(n)[1] for n in read} - {None})
    if missing or len(unknown) > len(read):
        raise RefllamaError(
            f"MINE: compare can read {len(read)} of its {len(mine.names)} stages ({_few(read) or 'none'}); "
            f"{len(unknown)} are no stage of this family ({_few(unknown)})"
            + (f", and layer{'s' if len(missing) > 1 else ''} {spans(missing)} {'have' if len(missing) > 1 else 'has'}"
               " no stage it can read" if missing else "")
            + ": the names are llama.cpp's graph names (checkpoints/FORMAT.md)")


def bits_of(a):  # -> the array's values as integers that are equal exactly where the values' bits are
    a = np.asarray(a)
    return a.astype(np.float32).view(np.uint32) if a.dtype.kind == "f" else a


def rounded_stages(d):  # the stages a dump declares rounded: its map's, and with a 16-bit KV cache the attention's
    kv = ("kq", "kq_scaled_2", "kq_soft_max", "kqv_out") if d.kv_cache not in (None, "float32") else ()
    return {*d.rounded, *kv}


# the residual stream's stages (the inputs, the residual sums and the norms that read them, the last norm): each
# sublayer reads one of them and adds into the next, so error that surfaces at a stage entered after the last of
# these compared before it
STREAM_STAGES = (*INPUT_STAGES, *(s for s, f in WIRING.items() if f.kind in ("sum", "norm")
                                  and f.reads[0] in ((IN,), RESIDUAL)), "result_norm")


def unknown_slots(name, mine, ref):  # -> the side without ffn_moe_topk where `name` is a stage per expert slot
    stage, layer = split_name(name)
    if stage not in SLOT_STAGES or stage == "ffn_moe_topk":
        return None
    return next((side for side, d in (("MINE", mine), ("REF", ref)) if f"ffn_moe_topk-{layer}" not in d), None)


def entered(order, rows, name, mine, ref, unaligned=()):
    """Where error past the bands came from when every compared stage before `name` is within them and both sides'
    re-runs of it are too: after the last compared stage of the residual stream (or the last compared one), in the
    runs of stages only one side holds or both hold but cannot be aligned (`unaligned`), or in none (a step neither
    dump holds). A dict the first-divergence line reads."""
    stream = [r["name"] for r in rows if r["stage"] in STREAM_STAGES] or [r["name"] for r in rows]
    after = stream[-1] if stream else None
    between = order[order.index(after) + 1 if after else 0:order.index(name)]
    side = {n: "MINE" if n not in ref else "REF" if n not in mine else "unaligned" if n in unaligned else None
            for n in between}
    runs = {}  # side: [(first, last), ...], each a run of consecutive stages only that side holds
    for who, run in groupby(between, key=side.get):
        if who:
            run = list(run)
            runs.setdefault(who, []).append((run[0], run[-1]))
    return {"after": after, "only": runs}


def _few(names, n=6):
    return ", ".join(names[:n]) + (", ..." if len(names) > n else "")


def required(rows, want):
    """Refuse a comparison that lacks stages a CI asked for (--require-stages): each name as given with its layer,
    one without a layer in every layer compared (or once: a stage before or after the blocks)."""
    compared = {r["name"] for r in rows}
    layers = sorted({r["layer"] for r in rows} - {None})
    outside = (*INPUT_STAGES, *OUTPUT_STAGES)
    missing = [n for w in want for n in ([w] if split_name(w)[1] is not None or w in outside else
                                         [f"{w}-{i}" for i in layers] or [w]) if n not in compared]
    if missing:
        raise RefllamaError(f"{len(missing)} required stage{'s' if len(missing) > 1 else ''} not compared "
                            f"({_few(missing)}): in both dumps at the same positions? ({len(compared)} compared)")


def compare(mine_path, ref_path, model=None, column=None, numerics=None, require=()):
    """A Report: per stage both dumps hold, in forward order, the end-to-end error and each side's local error;
    the first stage that adds error; where it sits and what it looks like. `require`: stage names that must be
    compared (`required`)."""
    layout, head_dim = (model.config.rope_layout, model.config.head_dim) if model else (None, None)
    v_order, v_heads = (model.config.linear_v_order, (model.config.linear_k_heads, model.config.linear_v_heads)
                        ) if model else (None, None)
    widths = latent_widths(model.config) if model else None
    ref = Dump(ref_path, layout=layout, head_dim=head_dim, v_order=v_order, v_heads=v_heads,
               widths=widths)  # no model: REF's layouts
    mine = Dump(mine_path, layout=ref.want_layout, head_dim=head_dim, v_order=ref.want_v, v_heads=v_heads,
                widths=widths)
    if numerics:
        mine.numerics = numerics
    if mine.prompt_ids != ref.prompt_ids:
        raise RefllamaError("the dumps are of different token ids; compare runs of the same tokens "
                            "(python -m refllama.run --dump-dir REF --tokens-from MINE makes refllama's)")
    col = choose_column(mine, ref, column)
    experts_used(mine, ref, model)
    forced, notes = {}, []
    if model is not None:
        sha = model_sha256(model.path)
        for side, d in (("MINE", mine), ("REF", ref)):
            if d.manifest.get("model_sha256") and d.manifest["model_sha256"] != sha:
                notes.append(f"{side} ran another model (sha256 differs from {os.path.basename(model.path)}): "
                             "its stages are not re-run")
            else:
                forced[side] = Forced(model, d)
    paths = {side: d.cpu_path for side, d in (("MINE", mine), ("REF", ref)) if d.cpu_path}
    if paths:  # which of llama.cpp's CPU paths each side computes: its float steps differ in the last bits
        notes.append("cpu path: " + (f"{ref.cpu_path} (both)" if len(set(paths.values())) == 1 and len(paths) == 2
                                      else ", ".join(f"{side} {p}" for side, p in paths.items())))
    same = len(os.path.commonprefix([mine.token_ids, ref.token_ids]))  # positions with the same history
    if same < min(len(mine.token_ids), len(ref.token_ids)):
        notes.append(f"the decode tokens differ from position {same}: positions >= {same} are not compared")
    readable(mine, known_stages(ref.arch))
    arch = archs.get(ref.arch)
    order = forward_order(list(dict.fromkeys([*ref.names, *mine.names])), archs.stage_order(arch))
    rows, first, previous, undeclared = [], None, None, {}  # undeclared: MINE's stages found rounded
    declared = False  # error past the bands has come in at a stage a side declares rounded: later stages carry it
    passed = sorted({split_name(n)[0] for n in order} & set(NOT_COMPARED))
    notes.extend(f"not compared: {stage}, {NOT_COMPARED[stage]}" for stage in passed)
    unaligned = [n for n in order if n in mine and n in ref and unknown_slots(n, mine, ref)]
    if unaligned:
        notes.append(f"not compared: {_few(unaligned)}: {unknown_slots(unaligned[0], mine, ref)} dumps no "
                     "ffn_moe_topk, so which expert each of a token's K slots holds is unknown (dump ffn_moe_topk); "
                     "the slots' sum, ffn_moe_out, is compared")
    for name in [n for n in order if n in mine and n in ref and split_name(n)[0] not in NOT_COMPARED
                 and n not in unaligned]:
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
                x, y = take(d, name, own), take(f, name, own, slots=d)  # the re-run took d's experts
                row[f"local_{side}"] = metrics(x, y, visible(stage, own, y.shape))
        local_tol = col.local(stage)
        tols = {side: side_band(local_tol, d, stage) for side, d in (("MINE", mine), ("REF", ref))}
        adds = [s for s in ("MINE", "REF") if f"local_{s}" in row and not within(row[f"local_{s}"], tols[s])]
        row["local_tol"] = local_tol
        row["adds"] = adds
        both_local = all(f"local_{s}" in row for s in ("MINE", "REF"))
        e2e_ok = within(row, row["tol"])
        if col.bits:  # a bit-exact claim: every value's bits, ids' too
            row["bits_differ"] = int(np.count_nonzero(bits_of(a) != bits_of(b)))
            e2e_ok = e2e_ok and not row["bits_differ"]
            both_local = False  # a re-run on each side's inputs cannot clear a bit that differs
        row["ok"] = not adds and (both_local or e2e_ok)
        row["carried"] = not e2e_ok and row["ok"]
        row["verdict"] = ("adds error" if adds else "bits differ" if row.get("bits_differ") else
                          "past tolerance" if not row["ok"] else "carries error" if row["carried"] else
                          "within tolerance")
        if row["carried"] and first is None and not declared:
            if any(stage in rounded_stages(d) for d in (mine, ref)):  # the precision a side declares
                declared = True
            else:  # no stage before it failed, none was declared rounded: the error entered between the two
                row["entered"] = entered(order, rows, name, mine, ref, unaligned)
                row["verdict"] = "entered before it"
        rows.append(row)
        previous = row
        if mine.numerics == "float32" and stage not in mine.rounded and a.size >= 16 and not np.all(a == np.round(a)):
            # (whole numbers, expert ids among them, are float16 and bfloat16 numbers whatever the engine computes in)
            with np.errstate(over="ignore"):  # values past float16's range are no float16 numbers
                fmt = next((f for f in ("bfloat16", "float16") if np.array_equal(ROUND[f](a), a)), None)
            if fmt:
                undeclared.setdefault(stage, fmt)
        if first is None and (not row["ok"] or "entered" in row):
            first = row
    required(rows, require)
    if undeclared:
        notes.append(rounding_note(undeclared, {r["stage"] for r in rows}))
    if model is not None:
        notes.extend(untested(model, ref, same))
    notes.extend(references.notes(model, mine, ref, rows))
    report = Report(rows, first, col, notes, coverage(mine, ref), [], [], [])
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
    hinted: list  # the registered hints (diagnose.HINTS) that said them, by name


def coverage(mine, ref):
    """Lines for the summary: layers and stages compared, names in one dump only, names the family does not know (a
    line a stage, with the family's own name for the value or the closest one, so a misspelling is seen), and
    whether MINE's are another family's."""
    both = [n for n in ref.names if n in mine]
    layers = sorted({split_name(n)[1] for n in both} - {None})
    decode = sorted({p for n in both for p in mine.positions(n)} & {p for n in both for p in ref.positions(n)}
                    - set(range(len(ref.prompt_ids))))
    lines = [f"compared: {len(both)} stages in {len(layers)} layers ({spans(layers)})"
             + (f", decode positions {spans(decode)}" if decode else "")]
    forms = {"the paper's expanded form": set(getattr(archs.get(ref.arch), "EXPANDED_STAGES", ())),
             "llama.cpp's absorbed form": set(getattr(archs.get(ref.arch), "ABSORBED_STAGES", ()))}
    for who, d, other in (("only in MINE", mine, ref), ("only in REF", ref, mine)):
        alone = [n for n in d.names if n not in other]
        form = next((f for f, stages in forms.items() if alone and stages and {split_name(n)[0] for n in alone}
                     <= stages), None)  # latent attention's stages of one form (docs/mla.md)
        if alone:
            lines.append(f"{who}: {len(alone)} ({', '.join(alone[:6])}{', ...' if len(alone) > 6 else ''})"
                         + (f": latent attention in {form}, compared at the stages both forms share" if form else ""))
    known = known_stages(ref.arch)
    family = ref.arch
    unknown = {}  # stage: the layers it is named in
    for n in dict.fromkeys([*mine.names, *ref.names]):
        stage, layer = split_name(n)
        if stage not in known:
            unknown.setdefault(stage, []).append(layer)
    for stage, layers in unknown.items():
        at = [x for x in layers if x is not None]
        shown = f"'{stage}' in {len(at)} layers ({spans(at)})" if len(at) > 1 else f"'{stage}-{at[0]}'" if at \
            else f"'{stage}'"
        same = next((x for pair in SAME_VALUE if stage in pair for x in pair if x != stage and x in known), None)
        lines.append(f"unknown stage {shown}" + (f" ({family}'s name for it is '{same}')" if same else
                                                  closest(stage, known)))
    theirs = {s for s in unknown if any(split_name(n)[0] == s for n in mine.names)}
    others = [a for a in archs.ARCHITECTURES if a != family and theirs and theirs <= set(known_stages(a))]
    if others:
        lines.append(f"MINE's stages {', '.join(sorted(theirs))} are another family's ({', '.join(others)}), not "
                     f"{family}'s: was it run through another family's forward?")
    return lines
