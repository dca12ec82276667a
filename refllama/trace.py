"""Tracing: record every stage of a forward pass under llama.cpp's tensor names.

The model calls `tap(name, layer, x)` at each stage; it returns x untouched and costs one global lookup
when nothing records. `with trace(m) as t: m.logits(ids)` collects NumPy copies, `t["attn_norm-0"]`.
"""

from collections.abc import Mapping
from contextlib import contextmanager

from .xp import to_numpy

_recorder = None


def tap(name, layer, x):
    """Hand stage `name` of `layer` (None outside the blocks) to the active recorder, if any; return x."""
    if _recorder is not None:
        _recorder.record(name, layer, x)
    return x


def stage_name(name, layer):
    return name if layer is None else f"{name}-{layer}"


class Trace(Mapping):
    """The stages of the forward passes run while it was active, in order; a stage seen twice keeps the last.
    A read-only mapping: `t["attn_norm-0"]`, `t.keys()`, `t.items()`, `t.get(name)`, `dict(t)`.

    `names`, if given, limits what is kept (a long prompt's every stage is hundreds of MB).
    """

    def __init__(self, names=None):
        self.arrays = {}
        self.names = None if names is None else set(names)

    def record(self, name, layer, x):
        key = stage_name(name, layer)
        if self.names is not None and key not in self.names:
            return
        self.arrays.pop(key, None)  # re-insert, so order is that of the last pass
        self.arrays[key] = to_numpy(x).copy()  # a copy: cache views are overwritten by later steps

    def __getitem__(self, key):
        return self.arrays[key]

    def __iter__(self):
        return iter(self.arrays)

    def __len__(self):
        return len(self.arrays)


@contextmanager
def trace(model=None, names=None):
    """Record the stages of every forward pass run inside the block (`model` reads well at the call site;
    any model's passes are recorded); `names` limits the stages kept."""
    global _recorder
    if _recorder is not None:
        raise RuntimeError("refllama.trace() blocks cannot be nested")
    _recorder = Trace(names)
    try:
        yield _recorder
    finally:
        _recorder = None
