"""refllama's re-run of a dump's stages on that dump's own inputs: each stage's local check, and the re-runs a hint
makes of its hypothesis (another layer's weights)."""

import itertools
import os
import tempfile

import numpy as np

from ..numerics.ggml_tables import round_bf16, round_f16
from ..trace import recording, stage_name
from ..xp import to_numpy
from .dump import OUTPUT_STAGES, Dump, output_rows, split_name, stack_records

ROUND = {"float16": lambda x: round_f16(np.asarray(x, np.float32)), "bfloat16": round_bf16}  # a format's rounding


class Forced:
    """refllama's value of every stage when each stage a dump holds is replaced by the dump's value as the
    forward pass goes: a stage's value here is computed from the dump's own inputs (its local check), in the dump's
    declared precision (the stages it rounds rounded so, K and V stored in its cache's type). The values are saved
    to a temporary directory as they are computed and read back a stage at a time, so that a long prompt's compare
    holds a few stages, not all of them."""

    def __init__(self, model, dump):
        self.model, self.dump, self.parts = model, dump, {}
        self.wanted = set(dump.names)
        self.tmp = tempfile.TemporaryDirectory(prefix="refllama-rerun-")  # removed with this object
        self.held = (None, None)  # the one stage read back last
        self.saved = itertools.count()  # the files' names
        model.cache.reset()
        f16 = model.cache.f16  # the model's numerics' cache type (float16 for "ggml"), unless the dump declares one
        model.cache.f16 = f16 if dump.kv_cache is None else dump.kv_cache == "float16"
        try:
            for ids, start in [(dump.prompt_ids, 0)] + [([t], len(dump.prompt_ids) + k)
                                                        for k, t in enumerate(dump.decode_ids)]:
                self.here = list(range(start, start + len(ids)))  # the positions of the rows that the stages have
                with recording(self):
                    model.forward(ids, start)
        finally:
            model.cache.f16 = f16
        self.names = list(self.parts)

    def record(self, name, layer, x):
        if name in self.dump.rounded:  # the engine rounds this stage's values: so does its re-run
            x = self.model.xp.asarray(ROUND[self.dump.rounded[name]](to_numpy(x)))
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
