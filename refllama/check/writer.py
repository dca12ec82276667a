"""Dumping from any Python engine in a few lines: a checked writer of the dump format (checkpoints/FORMAT.md) and,
for PyTorch engines, forward hooks that feed it by module name.

    from refllama.check import DumpWriter
    with DumpWriter("my-dump", token_ids=ids, arch="llama", qk_layout="half", model="model.gguf") as w:
        w.add("inp_embd", x)                      # [T, D]
        w.add("attn_norm-0", h)
        ...
        w.decode_step(next_id)                    # the stages added after this are a decode step's
        w.add("attn_norm-0", h1)                  # [1, D], position T

Each name is checked as it is added (a stage of the family, with a layer where a block's stage needs one, the
shape's axes as FORMAT.md gives them), so a misspelt name fails at the line that adds it, not at compare.
"""

import os
import re

import numpy as np

from ..errors import RefllamaError
from ..pairs import QK_STAGES
from ..xp import to_numpy
from .dump import (
    INPUT_STAGES,
    KV_CACHE_TYPES,
    OUTPUT_STAGES,
    PRODUCER_NUMERICS,
    ROUNDED_TO,
    StageWriter,
    closest,
    family,
    known_stages,
    model_sha256,
    split_name,
    stage_ndim,
)


def as_array(x):  # a float32 NumPy array of x (a torch tensor in any dtype, on any device; a CuPy array)
    return np.asarray(x.detach().float().cpu().numpy() if hasattr(x, "detach") else to_numpy(x), np.float32)


class DumpWriter:
    """A dump of one prompt (and its decode steps), written stage by stage and moved into place when the `with`
    block ends without an error (nothing half-written otherwise). `token_ids`: the prompt's ids; `model`: the
    model file, whose SHA-256 lets compare re-run the stages; `qk_layout`: the pair layout of the q/k values added
    (FORMAT.md); `numerics`, `rounded`, `kv_cache`: the engine's precision (kv_cache None: its numerics' own);
    `producer`: its name and version; `overwrite`: a dump already at `directory` is replaced when this one is
    complete (never anything else)."""

    def __init__(self, directory, token_ids, *, arch="llama", qk_layout=None, model=None, producer="an engine",
                 numerics="float32", rounded=None, kv_cache=None, head_dim=None, prompt=None, overwrite=False):
        if numerics not in PRODUCER_NUMERICS:
            raise RefllamaError(f"numerics must be one of {', '.join(PRODUCER_NUMERICS)}, got {numerics!r}")
        if kv_cache is not None and kv_cache not in KV_CACHE_TYPES:
            raise RefllamaError(f"kv_cache must be one of {', '.join(KV_CACHE_TYPES)}, got {kv_cache!r}")
        if any(f not in ROUNDED_TO for f in (rounded or {}).values()):
            raise RefllamaError(f"rounded must map stage names to one of {', '.join(ROUNDED_TO)}")
        self.arch = family(arch, "DumpWriter").NAME  # an unknown name now, not at the first stage added
        self.token_ids, self.decode_ids = [int(i) for i in token_ids], []
        self.known = known_stages(arch)
        self.provenance = {"producer": producer, "model": None if model is None else os.path.basename(model),
                           "model_path": None if model is None else os.path.abspath(model),
                           "model_sha256": "" if model is None else model_sha256(model), "prompt": prompt,
                           "token_ids": self.token_ids, "arch": arch, "qk_layout": qk_layout or "half",
                           "numerics": numerics, "rounded": dict(rounded or {}),
                           **({"kv_cache": kv_cache} if kv_cache else {}),
                           **({"head_dim": head_dim} if head_dim else {})}
        self.needs_layout = qk_layout is None  # q/k stages then need one: refused when added
        self.writer = StageWriter(directory, overwrite=overwrite)
        self.position = None  # None: the prefill; T + k: the k-th decode step

    def decode_step(self, token_id):
        """The stages added from now on are those of a decode step that feeds `token_id` at the next position."""
        self.decode_ids.append(int(token_id))
        self.position = len(self.token_ids) + len(self.decode_ids) - 1

    def add(self, name, x):
        """Stage `name` (llama.cpp's graph name, `-N` for block N) of the current pass: a prefill's rows for every
        prompt position, a decode step's for its one position."""
        stage, layer = split_name(name)
        if stage not in self.known:
            raise RefllamaError(f"'{name}' is no stage of {self.arch}{closest(stage, self.known)} "
                                "(checkpoints/FORMAT.md)")
        outside = stage in (*INPUT_STAGES, *OUTPUT_STAGES)
        if outside != (layer is None):
            raise RefllamaError(f"'{name}': {stage} is " + ("a stage outside the blocks: no layer suffix" if outside
                                                             else f"a block's stage: name its layer, {stage}-N"))
        if self.needs_layout and stage in QK_STAGES:
            raise RefllamaError(f"'{name}': q/k stages need the qk_layout of their values (DumpWriter(qk_layout="
                                "'half' or 'interleaved'))")
        a = as_array(x)
        a = a[0] if a.ndim == stage_ndim(stage) + 1 and a.shape[0] == 1 else a  # a batch axis of one
        if a.ndim not in (stage_ndim(stage), 2):
            raise RefllamaError(f"'{name}': {a.ndim} axes of shape {list(a.shape)}; FORMAT.md gives it "
                                f"{stage_ndim(stage)}")
        self.writer.at(self.position).save(name, a)

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if kind is not None:
            self.writer.abort()
            return False
        self.writer.finish({**self.provenance, "decode_ids": self.decode_ids})
        return False


def torch_hooks(module, stages, writer):
    """Forward hooks on a PyTorch model that add each named submodule's output to `writer` (a DumpWriter) under its
    stage name: `stages` maps module names to stage names, `{i}` standing for a layer's number in both
    ({"model.layers.{i}.input_layernorm": "attn_norm-{i}", "model.norm": "result_norm"}). A module's output that is
    a tuple gives its first element. Returns the hooks' handles (`handle.remove()` each when done)."""
    patterns = [(re.compile(re.escape(m).replace(r"\{i\}", r"(?P<i>\d+)") + "$"), s) for m, s in stages.items()]
    handles = []
    for path, sub in module.named_modules():
        for pattern, stage in patterns:
            hit = pattern.match(path)
            if hit:
                name = stage.replace("{i}", hit.group("i")) if "i" in pattern.groupindex else stage
                handles.append(sub.register_forward_hook(
                    lambda mod, inputs, out, name=name: writer.add(name, out[0] if isinstance(out, tuple) else out)))
    if not handles:
        raise RefllamaError("torch_hooks: no module of the model matches the names given (model.named_modules())")
    return handles
