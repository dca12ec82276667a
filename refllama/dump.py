"""Checkpoint dumps: one directory per run, one .npy per stage, a manifest.json (see checkpoints/FORMAT.md).

The same format is written by refllama (`--dump-dir`), by the reference tools in tools/, and by anyone's
engine; `read_dump` loads any of them and can convert q/k to either RoPE pair layout.
"""

import json
import os
import re
import tempfile
from pathlib import Path

import numpy as np

from . import arch as archs
from .arch import KV_STAGES, LAYOUTS, QK_STAGES, TOKEN_AXIS, permute_qk
from .errors import RefllamaError

FORMAT = "refllama-dump/1"


def split_name(name):
    """'attn_norm-3' -> ('attn_norm', 3); 'result_norm' -> ('result_norm', None)."""
    m = re.fullmatch(r"(.+)-(\d+)", name)
    return (m.group(1), int(m.group(2))) if m else (name, None)


def layer_stages(arch):
    """The stages of one block of architecture `arch` (a manifest's "arch"; llama's when absent), in order."""
    return archs.ARCHITECTURES.get(arch or "llama", archs.llama).STAGES


def forward_order(names, stages=archs.llama.STAGES):
    """Stage names sorted as a forward pass of blocks with these `stages` runs them (unknown stages last)."""
    def key(name):
        stage, layer = split_name(name)
        if stage == "inp_embd":
            return (0, 0, 0, name)
        if layer is not None and stage in stages:
            return (1, layer, stages.index(stage), name)
        if stage in ("result_norm", "result_output"):
            return (2, 0, ("result_norm", "result_output").index(stage), name)
        return (3, 0, 0, name)
    return sorted(names, key=key)


def file_sha256(path):
    import hashlib  # here, not at the top: OpenSSL's ~3 MB would sit in every numpy-backend process

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def model_sha256(path):
    """sha256 of a GGUF file, or of an HF directory's config.json and safetensors files, in name order."""
    if not os.path.isdir(path):
        return file_sha256(path)
    import hashlib

    files = sorted(p for p in Path(path).iterdir() if p.name == "config.json" or p.suffix == ".safetensors")
    return hashlib.sha256("".join(f"{p.name}:{file_sha256(p)}\n" for p in files).encode()).hexdigest()


def write_dump(directory, arrays, provenance, rows=None, dtypes=None):
    """Write stages {name: array} and a manifest; `rows` {name: token positions kept} and `dtypes`
    {name: dtype} store a subset of positions or a narrower float type. Written to a temporary directory
    first and renamed, so a failed dump leaves nothing half-written."""
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()):
        raise RefllamaError(f"{directory}: dump directory exists and is not empty")
    for key in ("producer", "model_sha256", "token_ids", "qk_layout"):
        if key not in provenance:
            raise RefllamaError(f"dump provenance lacks '{key}'")
    if provenance["qk_layout"] not in LAYOUTS:
        raise RefllamaError(f"qk_layout must be one of {LAYOUTS}, got {provenance['qk_layout']!r}")
    rows, dtypes = rows or {}, dtypes or {}
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".dump-", dir=directory.parent))
    tensors = []
    for name in forward_order(arrays, layer_stages(provenance.get("arch"))):
        stage, layer = split_name(name)
        a = np.asarray(arrays[name])
        axis = TOKEN_AXIS.get(stage, 0)
        n_tokens = a.shape[axis]
        keep = list(rows.get(name, range(n_tokens)))
        a = np.take(a, keep, axis=axis) if len(keep) != n_tokens else a
        a = np.ascontiguousarray(a.astype(dtypes.get(name, np.float32)))
        fname = name.replace("/", "_") + ".npy"
        np.save(tmp / fname, a)
        tensors.append({"name": name, "stage": stage, "layer": layer, "file": fname, "shape": list(a.shape),
                        "dtype": a.dtype.name, "token_axis": axis, "positions": keep})
    manifest = {"format": FORMAT, **provenance, "tensors": tensors}
    (tmp / "manifest.json").write_text(json.dumps(manifest, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    if directory.exists():
        directory.rmdir()
    os.replace(tmp, directory)
    return directory


def _entry(t, path):
    """A manifest's tensor entry with its defaults: stage and layer from the name, file NAME.npy, the stage's
    token axis (positions default to every one stored, see Dump.positions)."""
    if not isinstance(t, dict) or not isinstance(t.get("name"), str):
        raise RefllamaError(f"{path}: every entry of 'tensors' needs a string 'name'")
    stage, layer = split_name(t["name"])
    return {"stage": stage, "layer": layer, "file": t["name"] + ".npy", "token_axis": TOKEN_AXIS.get(stage, 0), **t}


def known_stages(arch):
    """Every stage name a dump of architecture `arch` can hold, without the layer suffix."""
    return ("inp_embd", *layer_stages(arch), "result_norm", "result_output")


class Dump:
    """A dump read back: `manifest`, `names` in forward order, `d[name]` as float32, `positions(name)`."""

    def __init__(self, directory, layout=None):
        self.dir = Path(directory)
        path = self.dir / "manifest.json"
        try:
            self.manifest = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RefllamaError(f"{self.dir}: not a dump directory (no manifest.json)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RefllamaError(f"{path}: invalid JSON ({e})") from None
        if self.manifest.get("format") != FORMAT:
            raise RefllamaError(f"{path}: format is {self.manifest.get('format')!r}, expected {FORMAT!r}")
        self.layout = self.manifest.get("qk_layout", "interleaved")
        self.want_layout = layout or self.layout
        self.rope_dim = self.manifest.get("rope_dim")  # None: every dim of a head rotates
        tensors = self.manifest.get("tensors", [])
        if not isinstance(tensors, list):
            raise RefllamaError(f"{path}: 'tensors' must be a list of entries")
        self.entries = {e["name"]: e for e in (_entry(t, path) for t in tensors)}
        self.names = forward_order(self.entries, layer_stages(self.manifest.get("arch")))
        self._cache = {}

    def __contains__(self, name):
        return name in self.entries

    def __getitem__(self, name):
        if name not in self._cache:
            e = self.entries.get(name)
            if e is None:
                raise KeyError(f"{self.dir}: no stage '{name}'")
            try:
                a = np.load(self.dir / e["file"], allow_pickle=False).astype(np.float32)
            except (OSError, ValueError) as err:
                raise RefllamaError(f"{self.dir / e['file']}: cannot read stage '{name}' ({err})") from None
            if "shape" in e and list(a.shape) != list(e["shape"]):
                raise RefllamaError(f"{self.dir / e['file']}: shape {list(a.shape)} differs from the manifest's "
                                    f"{e['shape']}")
            if e["stage"] in QK_STAGES and self.want_layout != self.layout:
                a = permute_qk(a, self.want_layout, self.rope_dim)
            self._cache[name] = a
        return self._cache[name]

    def positions(self, name):
        """The token positions stored for `name`: the manifest's, or 0..n-1 along its token axis."""
        e = self.entries[name]
        return e["positions"] if "positions" in e else list(range(self[name].shape[e["token_axis"]]))

    def token_axis(self, name):
        return self.entries[name]["token_axis"]


def storage_plan(n_layer, n_tokens, layers=None, max_rows=None, logit_rows=None, dtype=None, stages=archs.llama.STAGES):
    """What a stored dump of blocks with these `stages` keeps, as (names, rows, dtypes) for write_dump.

    layers: the blocks kept (None: all), plus each one's input `l_out-(N-1)` so every stage can be fed
    its own input; max_rows: token positions kept when the prompt is longer (the first 8 and the last
    ones; K and V keep every position, since attention reads all of them); logit_rows: the last
    positions whose logits are kept; dtype: storage type for every stage (float32 unless given).
    """
    layers = range(n_layer) if layers is None else [n_layer + n if n < 0 else n for n in layers]
    names = ["inp_embd", "result_norm", "result_output"]
    for n in layers:
        names += [f"{s}-{n}" for s in stages]
        if n > 0:
            names.append(f"l_out-{n - 1}")
    all_rows = list(range(n_tokens))
    kept = all_rows if not max_rows or n_tokens <= max_rows else all_rows[:8] + all_rows[-(max_rows - 8):]
    rows = {}
    for name in names:
        stage, _ = split_name(name)
        if stage == "result_output" and logit_rows:
            rows[name] = all_rows[-logit_rows:]
        elif stage not in KV_STAGES:
            rows[name] = kept
    return sorted(set(names)), rows, {name: dtype for name in names} if dtype else {}


def add_tool_args(parser, producer):
    """The command-line options shared by the reference dump tools: model, prompt, output, storage_plan's."""
    parser.add_argument("-m", "--model", default=None,
                        help="GGUF file or HF directory (default: the installed SmolLM2)")
    parser.add_argument("-p", "--prompt", required=True)
    parser.add_argument("--special", action="store_true", help="parse special tokens in the prompt (chat prompts)")
    parser.add_argument("-o", "--out", required=True, help="dump directory to create")
    parser.add_argument("--greedy", type=int, default=0,
                        help=f"also record {producer}'s greedy continuation of N tokens")
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--layers", help="comma-separated blocks to keep, negative from the end (default: all)")
    parser.add_argument("--max-rows", type=int, help="token positions kept per stage for longer prompts")
    parser.add_argument("--logit-rows", type=int, help="keep logits for the last N positions only")
    parser.add_argument("--float16", action="store_true", help="store stages as float16")


def plan_from_args(args, n_layer, n_tokens, stages=archs.llama.STAGES):
    layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    return storage_plan(n_layer, n_tokens, layers, args.max_rows, args.logit_rows,
                        np.float16 if args.float16 else None, stages)
