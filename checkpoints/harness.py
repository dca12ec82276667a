"""The checkpoint harness: stored reference dumps, refllama's own trace of the same prompt, and one check.

References: SmolLM2 (the default model) by llama.cpp and transformers over four prompts, in checkpoints/ref/; and
for each tiny family made by llama.cpp's converter (tools/make_tiny_gguf.py), llama.cpp on its F32 file (F32 KV
cache: float32 throughout) and transformers on the HF weights it came from, every stage of every layer, in
tests/data/gguf-FAMILY/.

Every stage is checked twice:
  isolated    refllama's layer function fed the reference's own input for that stage, so an error
              cannot hide upstream: a failure names the stage that is wrong;
  end_to_end  refllama's own forward pass from the tokens, as a user runs it.
Both go through `check`, with the tolerances of checkpoints/README.md.
"""

import json
import os
from functools import cache
from pathlib import Path
from typing import NamedTuple

import numpy as np

import refllama
from refllama import arch as archs
from refllama.check.dump import Dump
from refllama.check.metrics import metrics
from refllama.check.tolerances import band
from refllama.xp import to_numpy

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "tests" / "data"
KINDS = {"llamacpp": "llama.cpp", "hf": "float32", "llamacpp-f32": "llama.cpp F32"}  # reference -> column
EXACT_KINDS = ("float32", "llama.cpp F32", "ggml")  # the same arithmetic as refllama's: the same best tokens
FAMILIES = ("llama", "qwen2", "qwen3", "phi3")
FAMILY_N_CTX = 256  # Phi-3's original context, as its references were made (tools/make_tiny_gguf.py)
MODES = ("isolated", "end_to_end")


class Ref(NamedTuple):
    model: str  # "smollm2" or a tiny family
    source: str  # a KINDS key
    prompt: str
    path: Path


REFS = ([Ref("smollm2", p.parent.parent.name, p.parent.name, p.parent)
         for p in sorted((HERE / "ref").glob("*/*/manifest.json"))]
        + [Ref(f, s, "text", DATA / f"gguf-{f}" / s) for f in FAMILIES for s in ("llamacpp-f32", "hf")])


@cache
def reference(path):
    """A stored reference dump's prefill, q/k in the pair layout refllama uses for its architecture."""
    d = Dump(path, prefill_only=True)  # the decode steps are checkpoint_10's
    want = archs.get(d.manifest.get("arch", "llama")).ROPE_LAYOUT
    return d if d.layout == want else Dump(path, layout=want, prefill_only=True)


def smollm2_reference(source, prompt):
    return reference(HERE / "ref" / source / prompt)


def llamacpp_path():
    """The CPU path of llama.cpp's build that made SmolLM2's stored references (their manifests' `cpu_path`, one for
    all): numerics ggml reproduces that path's bits whatever the host's."""
    paths = {reference(r.path).cpu_path for r in REFS if r.model == "smollm2" and r.source == "llamacpp"}
    assert len(paths) == 1 and None not in paths, f"the llama.cpp references name their CPU paths, one for all: {paths}"
    return paths.pop()


def stored_layers(ref):
    return sorted({e["layer"] for e in reference(ref.path).entries.values() if e["layer"] is not None
                   and e["stage"] == "attn_norm"})


@cache
def family_model(family, backend="numpy"):
    return refllama.load(DATA / f"gguf-{family}" / f"{family}-f32.gguf", n_ctx=FAMILY_N_CTX, backend=backend)


@cache
def our_trace(model, token_ids, names):
    with refllama.trace(model, names=names) as t:
        model.logits(list(token_ids))
    return t


class Case:
    """One reference dump (a model's reference x a prompt) and refllama's trace of the same token ids."""

    def __init__(self, model, ref):
        self.model, self.prompt = model, ref.prompt
        self.source = ref.source
        # refllama in numerics "ggml" against llama.cpp: both compute llama.cpp's CPU arithmetic
        self.kind = "ggml" if model.numerics == "ggml" and ref.source == "llamacpp" else KINDS[ref.source]
        self.exact = self.kind in EXACT_KINDS
        self.dump = reference(ref.path)
        self.ref = self.dump if model.xp is np else OnDevice(self.dump, model.xp)  # inputs where the weights live
        self.ids = self.ref.manifest["token_ids"]
        self.w, self.cfg = model.weights, model.config

    def __repr__(self):
        return f"{self.source}/{self.prompt}/{self.cfg.arch}/{self.model.backend}/{self.model.numerics}"

    def has(self, stage):
        """Whether this model's blocks have `stage` (Qwen3's Qcur_normed, say)."""
        return stage in self.model.arch.STAGES

    def bias(self, layer, weight):
        return self.w["layers"][layer].get(f"{weight}_bias")

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
        assert got.shape == want.shape, f"{name} ({self!r}, {mode}): shape {got.shape} != {want.shape}"
        m = metrics(got, want)
        if os.environ.get("REFLLAMA_CHECKPOINT_LOG"):  # measured errors, for tools/tolerance_report.py
            with open(os.environ["REFLLAMA_CHECKPOINT_LOG"], "a", encoding="utf-8") as f:
                f.write(json.dumps({"name": name, "stage": stage, "kind": self.kind, "prompt": self.prompt,
                                    "mode": mode, **m}) + "\n")
        rel, nmse = band(self.kind, stage)
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
