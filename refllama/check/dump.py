"""Checkpoint dumps: one directory per run, one .npy per stage, a manifest.json (see checkpoints/FORMAT.md).

The same format is written by refllama (`--dump-dir`), by the reference tools in tools/, and by anyone's
engine; `Dump` reads any of them and can convert q/k to either RoPE pair layout.
"""

import difflib
import json
import os
import re
import shutil
import tempfile
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path

import numpy as np

from .. import arch as archs
from ..arch import LAYOUTS, QK_STAGES, permute_qk
from ..errors import RefllamaError
from ..numerics.cpu_paths import PATHS
from ..pairs import V_HEAD_ORDERS, V_HEAD_STAGES, reorder_v_heads
from ..trace import stage_name
from ..xp import to_numpy

FORMAT = "refllama-dump/1"
INPUT_STAGES = ("inp_embd", "pos_embd", "inpL", "inp_scaled")  # before the first block, in forward order (any family)
ATTENTION = ("kq", "kq_scaled_2", "kq_soft_max")  # [H, T, S] (kq_scaled_2: Gemma 2's soft-capped scores)
TOKEN_AXIS = dict.fromkeys(ATTENTION, 1)  # every other stage has tokens first
KV_STAGES = ("Kcur", "Kcur_normed", "Kcur_rope", "Vcur")  # keys and values: attention reads every position
RECURRENT_INPUTS = ("linear_attn_qkv_mixed", "q_conv_predelta", "k_conv_predelta", "v_conv", "gate", "beta_sigmoid",
                    "b")
# linear attention's conv and delta rule read every position before theirs: kept at every position, as K and V
LINEAR_HEAD_STAGES = ("q_conv", "k_conv", "v_conv", "q_conv_predelta", "k_conv_predelta", "attn_output")  # [T, n, LD]
LATENT_HEAD_STAGES = ("q", "q_nope", "q_pe", "k_pe", "q_nope_absorbed", "kv")  # latent attention's [T, n, d]
LATENT_ROPED = ("q_pe", "k_pe")  # its rotated parts, in the dump's qk_layout
SAME_VALUE = (("ffn_inp", "sa_out"),)  # one value, two families' names (the attention's residual sum: Gemma 3's)
OUTPUT_STAGES = ("result_norm", "result_output")  # a prefill needs these at the positions a dump keeps, no others


def output_rows(kept, n):
    """The rows of a prefill of n tokens that go on to the output head: those where a stage of OUTPUT_STAGES is
    kept (`kept`: their positions), and at least the last (generation's)."""
    return sorted({p for rows in kept for p in rows if 0 <= p < n} | {n - 1})


def split_name(name):
    """'attn_norm-3' -> ('attn_norm', 3); 'result_norm' -> ('result_norm', None)."""
    m = re.fullmatch(r"(.+)-(\d+)", name)
    return (m.group(1), int(m.group(2))) if m else (name, None)


def family(arch, where="the dump"):
    """The architecture module a dump's "arch" names (llama's when it names none); an error listing the names
    refllama knows for any other."""
    if arch is None:
        return archs.llama
    if arch not in archs.ARCHITECTURES:
        raise RefllamaError(f"{where}: 'arch' {arch!r} is no architecture refllama knows (GGUF's "
                            f"general.architecture: {', '.join(archs.ARCHITECTURES)})")
    return archs.ARCHITECTURES[arch]


def block_order(arch):
    """Every stage a block of architecture `arch` (a manifest's "arch"; llama's when absent) may tap, dense or
    mixture of experts, in forward order."""
    return archs.stage_order(family(arch))


def input_stages(arch):
    """The stages before the first block of architecture `arch` (inp_embd; Gemma 3's inp_scaled too)."""
    return family(arch).INPUTS


def forward_order(names, stages):
    """Stage names sorted as a forward pass of blocks with these `stages` runs them (unknown stages last)."""
    def key(name):
        stage, layer = split_name(name)
        if stage in INPUT_STAGES:
            return (0, 0, INPUT_STAGES.index(stage), name)
        if layer is not None and stage in stages:
            return (1, layer, stages.index(stage), name)
        if stage in ("result_norm", "result_output"):
            return (2, 0, ("result_norm", "result_output").index(stage), name)
        return (3, 0, 0, name)
    return sorted(names, key=key)


def file_sha256(path):
    """sha256 of a file, computed once per (path, size, mtime): compare checks a 100 MB model more than once."""
    st = os.stat(path)
    return _sha256(os.path.abspath(path), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=64)
def _sha256(path, size, mtime_ns):
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


def is_dump(directory):  # whether a directory holds a dump (a manifest.json of this format)
    try:
        return json.loads((Path(directory) / "manifest.json").read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


class StageWriter:
    """A dump written a stage at a time, into a temporary directory beside `directory` that `finish` renames, so that
    a long run holds no stage longer than it takes to save it and a failed one leaves nothing half-written (`abort`
    removes it). `rows` {name: token positions kept} and `dtypes` {name: dtype} store a subset of a prefill's
    positions or a narrower float type; `names`, if given, are the stages kept. A recorder (refllama.trace.recording):
    `at(position)` says which pass the next stages are of (None: the prefill; T + k: the k-th decode step, each stage
    its own record NAME@POSITION.npy). A prefill's logits are computed only for the positions it keeps, as
    llama.cpp computes only its output rows: result_norm goes on to the output head with those rows alone.
    `overwrite`: a dump already at `directory` is replaced (once the new one is complete)."""

    def __init__(self, directory, rows=None, dtypes=None, names=None, overwrite=False):
        self.directory = Path(directory)
        if self.directory.exists() and any(self.directory.iterdir()) and not (overwrite and is_dump(self.directory)):
            raise RefllamaError(f"{self.directory}: dump directory exists and is not empty" + (
                " (and is no dump: overwrite replaces only a dump)" if overwrite else " (overwrite=True replaces a "
                                                                                     "dump there)"))
        self.rows, self.dtypes, self.names = rows or {}, dtypes or {}, None if names is None else set(names)
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=".dump-", dir=self.directory.parent))
        self.tensors, self.position = [], None  # tensors: (pass, entry), a pass None (the prefill) or a position
        self.out = None  # the prefill positions result_norm's rows went on with, once it has been recorded

    def at(self, position):
        self.position = position
        return self

    def record(self, name, layer, x):
        key = stage_name(name, layer)
        if self.names is None or key in self.names:
            self.save(key, to_numpy(x))
        if key == "result_norm" and self.position is None:
            n = len(x)
            self.out = output_rows([self.rows.get(k, range(n)) for k in OUTPUT_STAGES], n)
            if len(self.out) < n:
                return x[self.out]
        return x

    def save(self, name, a):  # a stage of the pass `at` names
        at = self.position
        stage, layer = split_name(name)
        axis = TOKEN_AXIS.get(stage, 0)
        here = self.out if at is None and name == "result_output" and self.out else range(a.shape[axis])
        keep = list(self.rows.get(name, here)) if at is None else [at]
        if at is None and keep != list(here):
            index = {p: i for i, p in enumerate(here)}
            a = np.take(a, [index[p] for p in keep], axis=axis)
        dtype = np.dtype(self.dtypes.get(name, np.float32))
        if dtype == np.float16 and np.abs(a[np.isfinite(a)]).max(initial=0) > np.finfo(np.float16).max:
            dtype = np.dtype(np.float32)  # float16 storage only where the values fit (Gemma's residual stream)
        a = np.ascontiguousarray(a.astype(dtype))
        fname = name.replace("/", "_") + ("" if at is None else f"@{at}") + ".npy"
        np.save(self.tmp / fname, a)
        self.tensors.append((at, {"name": name, "stage": stage, "layer": layer, "file": fname, "shape": list(a.shape),
                                  "dtype": a.dtype.name, "token_axis": axis, "positions": keep}))

    def finish(self, provenance):
        """Write the manifest (the tensors of each pass in forward order) and move the dump into place."""
        for key in ("producer", "model_sha256", "token_ids", "qk_layout"):
            if key not in provenance:
                raise RefllamaError(f"dump provenance lacks '{key}'")
        if provenance["qk_layout"] not in LAYOUTS:
            raise RefllamaError(f"qk_layout must be one of {LAYOUTS}, got {provenance['qk_layout']!r}")
        order = block_order(provenance.get("arch"))
        by_pass = {}  # in the order the passes ran
        for at, t in self.tensors:
            by_pass.setdefault(at, {})[t["name"]] = t
        tensors = [t[n] for t in by_pass.values() for n in forward_order(t, order)]
        manifest = {"format": FORMAT, **provenance, "tensors": tensors}
        (self.tmp / "manifest.json").write_text(json.dumps(manifest, ensure_ascii=False, indent=1) + "\n",
                                                encoding="utf-8")
        if self.directory.exists():  # empty, or a dump to replace: set aside until the new one is in place
            old = Path(tempfile.mkdtemp(prefix=".replaced-", dir=self.directory.parent))
            os.replace(self.directory, old / "dump")
            os.replace(self.tmp, self.directory)
            shutil.rmtree(old)
        else:
            os.replace(self.tmp, self.directory)
        return self.directory

    def abort(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


def write_dump(directory, arrays, provenance, rows=None, dtypes=None, decode=()):
    """Write stages {name: array} and a manifest (StageWriter: `rows`, `dtypes`); `decode` holds one {name: array}
    per decode step after the prefill (positions T, T+1, ..., whose tokens are provenance["decode_ids"])."""
    writer = StageWriter(directory, rows, dtypes)
    try:
        order, n = block_order(provenance.get("arch")), len(provenance.get("token_ids", ()))
        for at, stages in [(None, arrays)] + [(n + k, step) for k, step in enumerate(decode)]:
            writer.at(at)
            for name in forward_order(stages, order):
                writer.save(name, np.asarray(stages[name]))
        return writer.finish(provenance)
    except BaseException:
        writer.abort()
        raise


def closest(stage, known):
    """" (did you mean 'X'?)" for the known stage nearest a misspelt one, or ""."""
    close = difflib.get_close_matches(stage, known, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


NOT_COMPARED = {  # stages an engine may dump under llama.cpp's name that compare reads past, and why
    "ffn_moe_argsort": "every expert in order of probability (llama.cpp's argsort): its first K are ffn_moe_topk, "
                       "compared there; past the K-th, near-equal probabilities may order either way",
}


def known_stages(arch):
    """Every stage name a dump of architecture `arch` can hold, without the layer suffix."""
    moe = "ffn_moe_logits" in block_order(arch)
    return (*input_stages(arch), *block_order(arch), "result_norm", "result_output",
            *(NOT_COMPARED if moe else ()))


# what a dump's producer computes in (any engine's; refllama's own are xp.NUMERICS); "ggml": llama.cpp's quantized
PRODUCER_NUMERICS = ("float32", "bfloat16", "float16", "ggml")
ROUNDED_TO = ("float16", "bfloat16")  # what an engine computing in float32 may round some stages' values to
KV_CACHE_TYPES = ("float32", "float16")  # what it may keep K and V in (float16: llama.cpp's default cache type)


def numerics_of(manifest):
    """A dump's declared `numerics`, or the one its producer implies: llama.cpp's quantized arithmetic for
    llama.cpp (unless run with F32 weights and KV cache), float32 for anything else."""
    declared = manifest.get("numerics")
    if declared is not None:
        if declared not in PRODUCER_NUMERICS:
            raise RefllamaError(f"manifest field 'numerics' must be one of {', '.join(PRODUCER_NUMERICS)}, "
                                f"got {declared!r}")
        return declared
    producer = str(manifest.get("producer", "")).lower()
    return "ggml" if "llama.cpp" in producer and "f32 weights and kv cache" not in producer else "float32"


ROUTED_STAGES = ("ffn_moe_gate", "ffn_moe_up", "ffn_moe_swiglu", "ffn_moe_down", "ffn_moe_weighted",  # [T, K, X]
                 "ffn_moe_gate_biased", "ffn_moe_up_biased", "ffn_moe_swiglu_oai", "ffn_moe_down_biased")


def stage_ndim(stage):
    """The number of axes of a stage as FORMAT.md gives it: [T, n, HD] for q/k/v, [H, T, S] for kq, [T, K, X] for a
    token's K routed experts, [T, n, LD] for linear attention's heads, else [T, X]."""
    return 3 if stage in QK_STAGES or stage in ("Vcur", *ATTENTION, *ROUTED_STAGES, *LINEAR_HEAD_STAGES,
                                                *LATENT_HEAD_STAGES) else 2


def _fail(where, message):
    raise RefllamaError(f"{where}: {message}")


def _rounded(value, where, stages):
    """The manifest's `rounded`: {stage: "float16" or "bfloat16"}, the stages whose values the engine rounds
    (a JSON object, or its text in a safetensors header); {} when absent."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            _fail(where, f"'rounded' is not a JSON object: {value[:60]!r}")
    value = {} if value is None else value
    if not isinstance(value, dict) or not all(isinstance(f, str) and f in ROUNDED_TO for f in value.values()):
        _fail(where, "'rounded' must map stage names to one of " + ", ".join(ROUNDED_TO)
              + ' (e.g. {"inp_embd": "float16"})')
    unknown = [k for k in value if k not in stages]
    if unknown:
        _fail(where, f"'rounded' names no stage of this family: {', '.join(unknown[:4])} (stage names without the "
              "layer: attn_norm, not attn_norm-0)")
    return dict(value)


def _int_list(value, where, field):
    if isinstance(value, str):  # a safetensors metadata value: JSON or comma-separated
        try:
            value = json.loads(value if value.lstrip().startswith("[") else f"[{value}]")
        except json.JSONDecodeError:
            _fail(where, f"'{field}' is not a list of integers: {value[:60]!r}")
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        _fail(where, f"'{field}' must be a list of integers")
    return value


def _read_directory(d):
    path = d / "manifest.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        _fail(d, "not a dump (no manifest.json; a dump is a directory with one, or one .safetensors file)")
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        _fail(path, f"cannot read the manifest ({e})")
    if not isinstance(manifest, dict):
        _fail(path, "the manifest must be a JSON object")
    tensors = manifest.get("tensors", [])
    if not isinstance(tensors, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                                for t in tensors):
        _fail(path, "'tensors' must be a list of entries, each with a string 'name'")

    def loader(file):
        def load():
            try:
                return np.load(d / file, allow_pickle=False)
            except (OSError, ValueError) as e:
                _fail(d / file, f"cannot read ({e})")
        return load
    return manifest, [{**t, "load": loader(t.get("file", t["name"] + ".npy"))} for t in tensors]


def _read_safetensors(path):
    from ..formats.hf_loader import SafeTensors

    st = SafeTensors(path)
    manifest = dict(st.metadata)
    entries = []
    for key in st.entries:
        name, _, first = key.partition("@")  # "Qcur-0@9": a record whose rows start at position 9
        if first and not first.isdigit():
            _fail(path, f"tensor '{key}': after '@' comes the first position, a number")
        entries.append({"name": name, "first": int(first or 0), "load": lambda key=key: st.tensor(key)})
    return manifest, entries


def stack_records(parts, axis):
    """[(positions, array)] of one stage -> (array, positions): rows stacked along the token axis. kq and
    kq_soft_max (axis 1) of decode steps have one key more each step; the keys a row lacks are NaN."""
    if len(parts) == 1:
        return parts[0][1], list(parts[0][0])
    width = max(a.shape[-1] for _, a in parts)
    arrays = [np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, width - a.shape[-1])], constant_values=np.nan)
              if axis == 1 else a for _, a in parts]
    return np.concatenate(arrays, axis=axis), [p for pos, _ in parts for p in pos]


class Dump:
    """A dump read back: a directory (manifest.json and .npy files) or one .safetensors file (the manifest's
    fields in its metadata). `manifest`; `names` in forward order; `d[name]` float32, every record of that stage
    (the prefill's, each decode step's) stacked along its token axis; `positions(name)` the token position of
    each row; `token_ids` the token at every position (prompt, then `decode_ids`).

    Also read: a leading batch axis of 1, q/k/v as [T, H*HD] (split with `head_dim`, the manifest's or the one
    given; latent attention's stages with `widths`), float16 and bfloat16. `layout` converts q/k to that RoPE pair
    layout; `prefill_only` leaves the decode steps out.
    """

    def __init__(self, path: str | os.PathLike, layout: str | None = None, head_dim: int | None = None,
                 prefill_only: bool = False, v_order: str | None = None, v_heads: tuple | None = None,
                 widths: dict | None = None):
        self.dir, self.prefill_only = Path(path), prefill_only
        self.widths = widths or {}  # latent attention's stages dumped [T, n*d]: d per stage (latent_widths)
        if self.dir.is_file() and self.dir.suffix == ".safetensors":
            self.manifest, raw = _read_safetensors(self.dir)
        elif self.dir.is_dir():
            self.manifest, raw = _read_directory(self.dir)
        else:
            _fail(self.dir, "no such dump (a directory with manifest.json, or a .safetensors file)")
        m = self.manifest
        if m.get("format") != FORMAT:
            _fail(self.dir, f"'format' is {m.get('format')!r}, expected {FORMAT!r}")
        if "token_ids" not in m:
            _fail(self.dir, "the manifest lacks 'token_ids' (the prompt's token ids, a list of integers)")
        self.prompt_ids = _int_list(m["token_ids"], self.dir, "token_ids")
        self.decode_ids = _int_list(m.get("decode_ids", []), self.dir, "decode_ids")
        self.token_ids = self.prompt_ids + self.decode_ids
        self.layout = m.get("qk_layout")
        if self.layout is not None and self.layout not in LAYOUTS:
            _fail(self.dir, f"'qk_layout' must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        self.want_layout = layout or self.layout
        self.v_order = m.get("v_head_order", "tiled")  # linear attention's v heads: tiled (llama.cpp's Qwen3.5) or
        if self.v_order not in V_HEAD_ORDERS:  # grouped (HF's, Qwen3-Next's)
            _fail(self.dir, f"'v_head_order' must be one of {', '.join(V_HEAD_ORDERS)}, got {self.v_order!r}")
        self.want_v = v_order or self.v_order  # the order its stages are read in (the model's)
        self.v_heads = None  # (LK, LV): the manifest's, else the model's; needed only to reorder
        if self.want_v != self.v_order and any(split_name(e["name"])[0] in V_HEAD_STAGES for e in raw):
            heads = m.get("linear_heads", list(v_heads or ()))
            if not (isinstance(heads, list) and len(heads) == 2 and all(isinstance(n, int) and n > 0 for n in heads)
                    and heads[1] % heads[0] == 0):
                _fail(self.dir, f"'v_head_order' {self.v_order} needs 'linear_heads': [q/k heads, v heads], v a "
                      f"multiple of q/k, to read its v heads {self.want_v} (got {heads!r})")
            self.v_heads = tuple(heads)
        self.rope_dim = int(m["rope_dim"]) if m.get("rope_dim") is not None else None  # None: a head's every dim
        self.head_dim = int(m.get("head_dim") or head_dim or 0) or None
        self.arch = family(m.get("arch"), self.dir).NAME
        self.numerics = numerics_of(m)
        self.rounded = _rounded(m.get("rounded"), self.dir, known_stages(self.arch))  # stage -> its format
        self.kv_cache = m.get("kv_cache")  # K/V as the engine's cache keeps them; None: as its numerics does
        if self.kv_cache is not None and self.kv_cache not in KV_CACHE_TYPES:
            _fail(self.dir, f"'kv_cache' must be one of {', '.join(KV_CACHE_TYPES)}, got {self.kv_cache!r}")
        self.repack = m.get("repack", True)  # numerics "ggml": llama.cpp's repacked x86 products, or vec_dot's
        if not isinstance(self.repack, bool):
            _fail(self.dir, f"'repack' must be true or false, got {self.repack!r}")
        self.cpu_path = m.get("cpu_path")  # numerics "ggml": which of llama.cpp's CPU paths (cpu_paths.PATHS)
        if self.cpu_path is not None and self.cpu_path not in PATHS:
            _fail(self.dir, f"'cpu_path' must be one of {', '.join(PATHS)}, got {self.cpu_path!r}")
        self.records = {}  # name -> its entries, in position order
        for e in raw:
            stage, layer = split_name(e["name"])
            e.update(stage=stage, layer=layer, token_axis=int(e.get("token_axis", TOKEN_AXIS.get(stage, 0))))
            self.records.setdefault(e["name"], []).append(e)
        self.entries = {n: {"name": n, "stage": es[0]["stage"], "layer": es[0]["layer"],
                            "token_axis": es[0]["token_axis"]} for n, es in self.records.items()}
        self.names = forward_order(self.records, block_order(self.arch))
        self._cache = OrderedDict()  # the last CACHED stages read: memory bounded whatever the prompt's length

    CACHED = 6

    def __contains__(self, name):
        return name in self.records

    def __getitem__(self, name):
        if name not in self._cache:
            if name not in self.records:
                raise KeyError(f"{self.dir}: no stage '{name}'")
            self._cache[name] = self._merge(name)
            while len(self._cache) > self.CACHED:
                self._cache.popitem(last=False)
        self._cache.move_to_end(name)
        return self._cache[name][0]

    def positions(self, name):
        self[name]
        return self._cache[name][1]

    def token_axis(self, name):
        return self.entries[name]["token_axis"]

    def rows(self, name):
        """[(positions, array)] per record of `name` (a decode step's kq keeps its own S)."""
        self[name]
        return self._cache[name][2]

    @staticmethod
    def axis_of(stage):
        """The token axis of a stage: 1 for kq and kq_soft_max [H, T, S], else 0."""
        return TOKEN_AXIS.get(stage, 0)

    def _merge(self, name):
        parts, seen = [], set()
        for e in self.records[name]:
            a = self._array(e)
            n = a.shape[e["token_axis"]]
            pos = e.get("positions")
            pos = list(range(e.get("first", 0), e.get("first", 0) + n)) if pos is None else \
                _int_list(pos, self.dir, f"positions of {name}")
            if len(pos) != n:
                _fail(self.dir, f"stage '{name}': {len(pos)} positions for {n} rows along axis {e['token_axis']}")
            for p in pos:
                if not 0 <= p < len(self.token_ids):
                    _fail(self.dir, f"stage '{name}': position {p} is past the {len(self.token_ids)} tokens of "
                          "'token_ids' and 'decode_ids'")
                if p in seen:
                    _fail(self.dir, f"stage '{name}': position {p} stored twice")
                seen.add(p)
            if not (self.prefill_only and pos and pos[0] >= len(self.prompt_ids)):
                parts.append((pos, a))
        parts.sort(key=lambda part: part[0][0] if part[0] else 0)
        try:
            return (*stack_records(parts, self.token_axis(name)), parts)
        except ValueError:
            _fail(self.dir, f"stage '{name}': its records' shapes differ: {[list(a.shape) for _, a in parts]}")

    def _array(self, e):
        """One record as float32, in the standard shape and the wanted pair layout."""
        name, stage = e["name"], e["stage"]
        a = e["load"]()
        if a.dtype.kind != "f":
            _fail(self.dir, f"stage '{name}' is {a.dtype}, not a float array")
        a = a.astype(np.float32)
        if "shape" in e and list(a.shape) != list(e["shape"]):
            _fail(self.dir, f"stage '{name}': shape {list(a.shape)} differs from the manifest's {e['shape']}")
        want = stage_ndim(stage)
        split_heads = want == 3 and stage not in (*ATTENTION, *ROUTED_STAGES, *LINEAR_HEAD_STAGES, *LATENT_HEAD_STAGES)
        if a.shape[:1] == (1,) and (a.ndim == want + 1 or (split_heads and a.ndim == 3 and self.head_dim
                                                             and a.shape[-1] != self.head_dim)):
            a = a[0]  # a batch of one (q/k/v as [1, T, n*HD] too)
        if a.ndim == 2 and stage in self.widths:  # latent attention's [T, n*d]
            a = a.reshape(len(a), -1, self.widths[stage])
        if a.ndim == 2 and split_heads:  # [T, n*HD]: split into heads
            if not self.head_dim or a.shape[1] % self.head_dim:
                _fail(self.dir, f"stage '{name}' is [T, n*HD] {list(a.shape)}; give the head dim (manifest "
                      "'head_dim', or a model) to split it")
            a = a.reshape(a.shape[0], -1, self.head_dim)
        if a.ndim != want:
            _fail(self.dir, f"stage '{name}' has shape {list(a.shape)}; FORMAT.md gives it {want} axes")
        if (stage in QK_STAGES or stage in LATENT_ROPED) and self.want_layout != self.layout:
            if self.layout is None:
                _fail(self.dir, "the manifest lacks 'qk_layout' (interleaved or half), needed for q/k stages")
            if stage in LATENT_ROPED or self.widths:  # latent attention: a head's last R dims are the rotated ones
                R = self.widths.get("q_pe") or a.shape[-1]
                a = np.concatenate([a[..., :-R], permute_qk(a[..., -R:], self.want_layout, R)], axis=-1)
            else:
                a = permute_qk(a, self.want_layout, self.rope_dim)
        if stage in V_HEAD_STAGES and self.v_heads is not None:  # v heads in the wanted order
            try:
                a = reorder_v_heads(stage, a, *self.v_heads, to=self.want_v)
            except (ValueError, IndexError):
                _fail(self.dir, f"stage '{name}' {list(a.shape)} does not split into the 'linear_heads' "
                      f"{list(self.v_heads)} (q/k heads, v heads)")
        return a


def latent_widths(cfg):  # -> {stage: a head's width} for latent attention's stages ({}: the model has none)
    if not cfg.kv_lora_rank:
        return {}
    nope, R = cfg.head_dim - cfg.rope_dim, cfg.rope_dim
    return {"q": cfg.head_dim, "q_nope": nope, "q_pe": R, "k_pe": R, "q_nope_absorbed": cfg.kv_lora_rank,
            "kv": nope + cfg.v_head_dim}


def v_head_fields(cfg):  # -> the manifest's fields for a model's linear-attention v heads ({} if it has none)
    if not cfg.linear_k_heads:
        return {}
    return {"v_head_order": cfg.linear_v_order, "linear_heads": [cfg.linear_k_heads, cfg.linear_v_heads]}


def storage_plan(n_layer, n_tokens, layers=None, max_rows=None, logit_rows=None, dtype=None, *, stages, inputs):
    """What a stored dump of blocks with these `stages` keeps, as (names, rows, dtypes) for write_dump; `stages`:
    one tuple for every block, or a list of one per block (refllama.arch.layer_stages: a mixture of experts').

    layers: the blocks kept (None: all), plus each one's input `l_out-(N-1)` so every stage can be fed
    its own input; max_rows: token positions kept when the prompt is longer (the first 8 and the last
    ones; K and V keep every position, since attention reads all of them); logit_rows: the last
    positions whose logits are kept; dtype: storage type for every stage (float32 unless given).
    """
    layers = range(n_layer) if layers is None else [n_layer + n if n < 0 else n for n in layers]
    for n in layers:
        if not 0 <= n < n_layer:
            raise RefllamaError(f"block {n} asked for: the model has blocks 0..{n_layer - 1}")
    names = [*inputs, "result_norm", "result_output"]
    per_layer = stages if isinstance(stages, list) else [stages] * n_layer
    for n in layers:
        names += [f"{s}-{n}" for s in per_layer[n]]
        if n > 0:
            names.append(f"l_out-{n - 1}")
    all_rows = list(range(n_tokens))
    kept = all_rows if not max_rows or n_tokens <= max_rows else all_rows[:8] + all_rows[-(max_rows - 8):]
    rows = {}
    for name in names:
        stage, _ = split_name(name)
        if stage == "result_output" and logit_rows:
            rows[name] = all_rows[-logit_rows:]
        elif stage not in (*KV_STAGES, *RECURRENT_INPUTS):
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
    parser.add_argument("--decode-steps", type=int, default=0,
                        help=f"also dump N decode steps, one greedy token each, after the prefill (by {producer})")
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("--layers", help="comma-separated blocks to keep, negative from the end (default: all)")
    parser.add_argument("--max-rows", type=int, help="token positions kept per stage for longer prompts")
    parser.add_argument("--logit-rows", type=int, help="keep logits for the last N positions only")
    parser.add_argument("--float16", action="store_true", help="store stages as float16")


def plan_from_args(args, n_layer, n_tokens, stages, inputs):
    layers = [int(x) for x in args.layers.split(",")] if args.layers else None
    return storage_plan(n_layer, n_tokens, layers, args.max_rows, args.logit_rows,
                        np.float16 if args.float16 else None, stages=stages, inputs=inputs)
