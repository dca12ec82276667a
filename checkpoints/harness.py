"""The checkpoint harness: stored reference dumps, refllama's own trace of the same prompt, and one check.

Every stage is checked twice:
  isolated    refllama's layer function fed the reference's own input for that stage, so an error
              cannot hide upstream: a failure names the stage that is wrong;
  end_to_end  refllama's own forward pass from the tokens, as a user runs it.
Both go through `check`, with the tolerances of checkpoints/README.md.
"""

import json
import os
from functools import lru_cache
from pathlib import Path

import numpy as np

import refllama
from refllama.compare import metrics, read_tolerances
from refllama.dump import Dump
from refllama.xp import to_numpy

HERE = Path(__file__).resolve().parent
TOLERANCES = read_tolerances(HERE / "README.md")
KINDS = {"llamacpp": "llama.cpp", "hf": "transformers"}
REFS = sorted((p.parent.parent.name, p.parent.name) for p in (HERE / "ref").glob("*/*/manifest.json"))
MODES = ("isolated", "end_to_end")


@lru_cache(maxsize=None)
def reference(ref, prompt):
    """A stored reference dump, q/k in refllama's interleaved layout."""
    return Dump(HERE / "ref" / ref / prompt, layout="interleaved")


def stored_layers():
    return sorted({e["layer"] for e in reference(*REFS[0]).entries.values() if e["layer"] is not None
                   and e["stage"] == "attn_norm"})


@lru_cache(maxsize=None)
def our_trace(model, token_ids, names):
    with refllama.trace(model, names=names) as t:
        model.logits(list(token_ids))
    return t


class Case:
    """One reference dump (a reference x a prompt) and refllama's trace of the same token ids."""

    def __init__(self, model, ref, prompt):
        self.model, self.ref_dir, self.prompt = model, ref, prompt
        self.kind = KINDS[ref]
        self.dump = reference(ref, prompt)
        self.ref = self.dump if model.xp is np else OnDevice(self.dump, model.xp)  # inputs where the weights live
        self.ids = self.ref.manifest["token_ids"]
        self.w, self.cfg = model.weights, model.config

    def __repr__(self):
        return f"{self.kind}/{self.prompt}/{self.model.backend}"

    def rows(self, name):
        """The token positions the reference stored for `name`."""
        return self.dump.positions(name)

    def ours(self, name):
        """refllama's end-to-end value of `name`, at the reference's positions."""
        t = our_trace(self.model, tuple(self.ids), tuple(self.dump.names))
        return np.take(t[name], self.rows(name), axis=self.dump.token_axis(name))

    def check(self, name, mode, got, positions=None):
        """Assert `got` matches the reference's `name` (at `positions`, default all it stored) within the
        table's tolerance for this stage."""
        stage = self.dump.entries[name]["stage"]
        want, got = self.dump[name], to_numpy(got)
        if positions is not None:
            stored = self.rows(name)
            want = np.take(want, [stored.index(p) for p in positions], axis=self.dump.token_axis(name))
        assert got.shape == want.shape, f"{name} ({self.kind}, {self.prompt}, {mode}): shape {got.shape} != {want.shape}"
        m = metrics(got, want)
        if os.environ.get("REFLLAMA_CHECKPOINT_LOG"):  # measured errors, for tools/tolerance_report.py
            with open(os.environ["REFLLAMA_CHECKPOINT_LOG"], "a", encoding="utf-8") as f:
                f.write(json.dumps({"name": name, "stage": stage, "kind": self.kind, "prompt": self.prompt,
                                    "mode": mode, **m}) + "\n")
        rel, nmse = TOLERANCES[self.kind][stage]
        assert m["max_rel"] <= rel and m["nmse"] <= nmse, (
            f"{name} departs from {self.kind} ({self.prompt} prompt, {mode}): max_rel {m['max_rel']:.2e} "
            f"(tolerance {rel:.0e}), nmse {m['nmse']:.2e} (tolerance {nmse:.0e})")
        return m


    def stage(self, name, mode, isolated, fed_by=None):
        """Check stage `name`: isolated, the value `isolated()` computes from the reference's own inputs (at
        the positions stored for stage `fed_by`, when given); end to end, refllama's own value."""
        if mode == "isolated":
            return self.check(name, mode, isolated(), positions=self.rows(fed_by) if fed_by else None)
        return self.check(name, mode, self.ours(name))


class OnDevice:
    """A reference dump whose arrays are handed out on the model's device (CuPy)."""

    def __init__(self, dump, xp):
        self.dump, self.xp = dump, xp

    def __getitem__(self, name):
        return self.xp.asarray(self.dump[name])

    def __getattr__(self, attr):
        return getattr(self.dump, attr)


def block_input(layer):
    """Name of the stage that feeds block `layer`."""
    return "inp_embd" if layer == 0 else f"l_out-{layer - 1}"
