"""The comparison engine: two checkpoint dumps of the same token ids, stage by stage in forward order, each stage's
error end to end beside the error of the stage before it, and, with the model at hand, each side's local error
(refllama re-runs the stage on that side's own inputs), so that the first stage that adds error is named."""

import itertools
import os
import tempfile
from typing import NamedTuple

import numpy as np

from .. import arch as archs
from ..errors import RefllamaError
from ..trace import recording, stage_name
from ..xp import to_numpy
from .diagnose import diagnose
from .dump import OUTPUT_STAGES, Dump, forward_order, known_stages, model_sha256, output_rows, split_name, stack_records
from .metrics import metrics, spans, take, visible, within, wrong_positions
from .tolerances import REFERENCE_KINDS, UNIT_ROUNDOFF, band

COLUMNS = (*REFERENCE_KINDS, *UNIT_ROUNDOFF)
COARSENESS = ("float32", "float16", "bfloat16", "ggml")  # a pair is judged by its coarser side's arithmetic


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


# ---- re-running stages on a dump's own inputs

class Forced:
    """refllama's value of every stage when each stage a dump holds is replaced by the dump's value as the
    forward pass goes: a stage's value here is computed from the dump's own inputs (its local check). The values
    are saved to a temporary directory as they are computed and read back a stage at a time, so that a long
    prompt's compare holds a few stages, not all of them."""

    def __init__(self, model, dump):
        self.model, self.dump, self.parts = model, dump, {}
        self.wanted = set(dump.names)
        self.tmp = tempfile.TemporaryDirectory(prefix="refllama-rerun-")  # removed with this object
        self.held = (None, None)  # the one stage read back last
        self.saved = itertools.count()  # the files' names
        model.cache.reset()
        for ids, start in [(dump.prompt_ids, 0)] + [([t], len(dump.prompt_ids) + k)
                                                    for k, t in enumerate(dump.decode_ids)]:
            self.here = list(range(start, start + len(ids)))  # the positions of the rows that the stages have
            with recording(self):
                model.forward(ids, start)
        self.names = list(self.parts)

    def record(self, name, layer, x):
        key = stage_name(name, layer)
        cut = key == "result_norm" and len(self.here) > 1  # logits only where the dump has them (llama.cpp's
        if key not in self.wanted and not cut:  # output rows): a long prompt's logits are T x V floats
            return x
        axis = Dump.axis_of(name)
        here = self.model.xp
        index = {p: i for i, p in enumerate(self.here)}
        if key in self.wanted:
            held = [p for p in self.dump.positions(key) if p in index]  # only the rows compare reads
            if held:
                path = os.path.join(self.tmp.name, f"{next(self.saved)}.npy")
                np.save(path, np.take(to_numpy(x), [index[p] for p in held], axis=axis).astype(np.float32))
                self.parts.setdefault(key, []).append((held, path))
            x = here.array(x, dtype=here.float32)  # a copy to write the dump's rows into
            for positions, a in self.dump.rows(key):
                for j, p in enumerate(positions):
                    if p in index:
                        i, row = index[p], np.take(a, j, axis=axis)
                        if axis == 1:  # [H, S]: only the keys position p sees (an engine may leave the rest unset)
                            x[:, i, :p + 1] = here.asarray(row[:, :p + 1])
                        else:
                            x[i] = here.asarray(row)
        if cut:
            start = self.here[0]
            kept = [[p - start for p in self.dump.positions(k)] for k in OUTPUT_STAGES if k in self.wanted]
            rows = output_rows(kept, len(self.here))
            if len(rows) < len(self.here):
                self.here = [start + i for i in rows]
                x = x[here.asarray(rows)]
        return x

    def _stage(self, name):  # -> (array, positions)
        if self.held[0] != name:
            parts = [(positions, np.load(path, mmap_mode="r")) for positions, path in self.parts[name]]
            self.held = (name, stack_records(parts, Dump.axis_of(split_name(name)[0])))
        return self.held[1]

    def __contains__(self, name):
        return name in self.parts

    def __getitem__(self, name):
        return self._stage(name)[0]

    def positions(self, name):
        return self._stage(name)[1]

    def token_axis(self, name):
        return Dump.axis_of(split_name(name)[0])


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
    known = known_stages(ref.arch)
    if mine.names and not any(split_name(n)[0] in known for n in mine.names):
        raise RefllamaError(f"MINE: none of its {len(mine.names)} stage names is one refllama knows (e.g. "
                            f"'{mine.names[0]}'); the names are llama.cpp's (checkpoints/FORMAT.md)")
    arch = archs.ARCHITECTURES.get(ref.arch, archs.llama)
    rows, first, previous = [], None, None
    for name in forward_order([n for n in ref.names if n in mine], archs.stage_order(arch)):
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
        adds = [s for s in ("MINE", "REF") if f"local_{s}" in row and not within(row[f"local_{s}"], local_tol)]
        row["local_tol"] = local_tol
        row["adds"] = adds
        both_local = all(f"local_{s}" in row for s in ("MINE", "REF"))
        e2e_ok = within(row, row["tol"])
        row["ok"] = not adds and (both_local or e2e_ok)
        row["carried"] = not e2e_ok and row["ok"]
        row["verdict"] = ("adds error" if adds else "past tolerance" if not row["ok"] else
                          "carries error" if row["carried"] else "within tolerance")
        rows.append(row)
        previous = row
        if first is None and not row["ok"]:
            first = row
            first["wrong_positions"] = wrong_positions(a, b, stage, positions, row["tol"]) if row["tol"] else []
    if model is not None:
        notes.extend(untested(model, ref, same))
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
    lines = [f"compared: {len(both)} stages in {len(layers)} layers ({spans(layers)})"
             + (f", decode positions {spans(decode)}" if decode else "")]
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
