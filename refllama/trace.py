"""Tracing: record every stage of a forward pass under llama.cpp's tensor names.

The model calls `tap(name, layer, x)` at each stage; it returns x untouched and costs one global lookup
when nothing records. `with trace(m) as t: m.logits(ids)` collects NumPy copies, `t["attn_norm-0"]`.
"""

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from .pairs import LAYOUTS, QK_STAGES, permute_qk
from .xp import to_numpy

_recorder = None


def tap(name, layer, x):
    """Hand stage `name` of `layer` (None outside the blocks) to the active recorder, if any, and go on with
    what it returns: x itself when tracing, another engine's value when refllama.compare re-runs stages."""
    return x if _recorder is None else _recorder.record(name, layer, x)


def stage_name(name, layer):
    return name if layer is None else f"{name}-{layer}"


class Trace(Mapping):
    """The stages of the forward passes run while it was active, in order; a stage seen twice keeps the last.
    A read-only mapping: `t["attn_norm-0"]`, `t.keys()`, `t.items()`, `t.get(name)`, `dict(t)`.

    `names`, if given, limits what is kept (a long prompt's every stage is hundreds of MB); `to_layout(stage, a)`,
    if given, converts q/k stages to another pair layout.
    """

    def __init__(self, names=None, to_layout=None):
        self.arrays = {}
        self.names = None if names is None else set(names)
        self.to_layout = to_layout

    def record(self, name, layer, x):
        key = stage_name(name, layer)
        if self.names is None or key in self.names:
            self.arrays.pop(key, None)  # re-insert, so order is that of the last pass
            a = to_numpy(x).copy()  # a copy: cache views are overwritten by later steps
            self.arrays[key] = self.to_layout(name, a) if self.to_layout else a
        return x

    def __getitem__(self, key):
        return self.arrays[key]

    def __iter__(self):
        return iter(self.arrays)

    def __len__(self):
        return len(self.arrays)


@contextmanager
def trace(model=None, names: Iterable[str] | None = None, qk_layout: str | None = None) -> Iterator[Trace]:
    """Record the stages of every forward pass run inside the block (any model's passes are recorded); `names`
    limits the stages kept. `qk_layout` ("half" or "interleaved") gives q/k stages in that RoPE pair layout
    rather than the model's own (llama.cpp's for its architecture); it needs `model`."""
    to_layout = None
    if qk_layout is not None:
        if model is None or qk_layout not in LAYOUTS:
            raise ValueError(f"trace(model, qk_layout=...) needs the model and one of {LAYOUTS}")
        if qk_layout != model.config.rope_layout:
            def to_layout(stage, a, rope_dim=model.config.rope_dim):
                return permute_qk(a, qk_layout, rope_dim) if stage in QK_STAGES else a
    with recording(Trace(names, to_layout)) as t:
        yield t


def recording_active():
    """Whether a recorder sees the stages now (a forward that skips them, the GPU's decode graph, must not run)."""
    return _recorder is not None


@contextmanager
def recording(recorder):
    """Make `recorder` (anything with record(name, layer, x) -> array) see every stage inside the block."""
    global _recorder
    if _recorder is not None:
        raise RuntimeError("refllama.trace() blocks cannot be nested")
    _recorder = recorder
    try:
        yield recorder
    finally:
        _recorder = None
