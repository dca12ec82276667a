"""Hugging Face model directories: config.json, safetensors (single or sharded, memory-mapped), tokenizer.

The architecture module that `architectures[0]` names reads the config and the weights table (refllama.arch);
every layout transform from HF's tensors to refllama's is listed in `arch.common.read_weights`.
"""

import json
import math
import os
import struct
from pathlib import Path

import numpy as np

from . import arch as archs
from .arch.common import read_weights
from .config import Loaded
from .errors import RefllamaError
from .xp import Placement

PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "consolidated.00.pth")
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


class Config:
    """config.json with errors that name the file and the field."""

    def __init__(self, path):
        self.path = path
        try:
            self.d = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RefllamaError(f"{path}: missing (an HF model directory needs config.json)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RefllamaError(f"{path}: invalid JSON ({e})") from None

    def need(self, key, kind=(int, float)):
        if key not in self.d or self.d[key] is None:
            raise RefllamaError(f"{self.path}: missing field '{key}'")
        value = self.d[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise RefllamaError(f"{self.path}: field '{key}' has the wrong type ({value!r})")
        return value

    def get(self, key, default=None):
        value = self.d.get(key)
        return default if value is None else value


class SafeTensors:
    """Tensors of one .safetensors file, memory-mapped; F32, F16 and BF16 (which safetensors' numpy API lacks)."""

    def __init__(self, path):
        self.path = str(path)
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise RefllamaError(f"{self.path}: truncated safetensors file (no header)")
            n = struct.unpack("<Q", head)[0]
            if 8 + n > size:
                raise RefllamaError(f"{self.path}: truncated safetensors file (header of {n} bytes, file of {size})")
            try:
                header = json.loads(f.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RefllamaError(f"{self.path}: not a safetensors file ({e})") from None
        self.metadata = header.pop("__metadata__", None) or {}  # str -> str, by the format
        self.entries, self.base = header, 8 + n
        self.buf = np.memmap(self.path, dtype=np.uint8, mode="r") if size > self.base else np.zeros(0, np.uint8)
        for name, e in header.items():
            begin, end = e["data_offsets"]
            if self.base + end > size:
                raise RefllamaError(f"{self.path}: truncated safetensors file: tensor '{name}' ends past the end")

    def __contains__(self, name):
        return name in self.entries

    def tensor(self, name):
        e = self.entries[name]
        if e["dtype"] not in _DTYPES:
            raise RefllamaError(f"{self.path}: tensor '{name}' has unsupported dtype {e['dtype']} (F32, F16, BF16)")
        begin, end = e["data_offsets"]
        raw = self.buf[self.base + begin:self.base + end].view(_DTYPES[e["dtype"]])
        if raw.size != math.prod(e["shape"]):
            raise RefllamaError(f"{self.path}: tensor '{name}' holds {raw.size} values, its shape {e['shape']} "
                                "needs more")
        if e["dtype"] == "BF16":  # bfloat16 is the top half of a float32
            return (raw.astype(np.uint32) << 16).view(np.float32).reshape(e["shape"])
        return raw.astype(np.float32).reshape(e["shape"])


class Checkpoint:
    """All tensors of a directory: model.safetensors, or the shards named by model.safetensors.index.json."""

    def __init__(self, directory):
        d = Path(directory)
        index = d / "model.safetensors.index.json"
        if index.exists():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (json.JSONDecodeError, KeyError, UnicodeDecodeError) as e:
                raise RefllamaError(f"{index}: invalid shard index ({e})") from None
            files = {}
            for shard in sorted(set(weight_map.values())):
                if not (d / shard).exists():
                    raise RefllamaError(f"{d / shard}: missing shard (listed in {index.name})")
                files[shard] = SafeTensors(d / shard)
            self.where = {name: files[shard] for name, shard in weight_map.items()}
        elif (d / "model.safetensors").exists():
            st = SafeTensors(d / "model.safetensors")
            self.where = {name: st for name in st.entries}
        else:
            pickled = [f for f in PICKLE_FILES if (d / f).exists()] + [p.name for p in d.glob("*.pt*")]
            if pickled:
                raise RefllamaError(f"{d / pickled[0]}: pickle-based checkpoints are never loaded (unpickling can run "
                                    "code); save the model as safetensors")
            raise RefllamaError(f"{d}: no model.safetensors or model.safetensors.index.json")
        self.dir = d

    def __contains__(self, name):
        return name in self.where

    def tensor(self, name, shape):
        if name not in self.where:
            raise RefllamaError(f"{self.dir}: missing tensor '{name}'")
        st = self.where[name]
        if name not in st:
            raise RefllamaError(f"{st.path}: missing tensor '{name}' (the shard index lists it here)")
        a = st.tensor(name)
        if a.shape != tuple(shape):
            raise RefllamaError(f"{st.path}: tensor '{name}' has shape {list(a.shape)}, expected {list(shape)}")
        return a


def eos_ids(c, directory):
    """End-of-generation ids named by config.json (already read) and generation_config.json: an int or a list."""
    ids = [c.get("eos_token_id")]
    if (Path(directory) / "generation_config.json").exists():
        ids.append(Config(Path(directory) / "generation_config.json").get("eos_token_id"))
    flat = [i for v in ids for i in (v if isinstance(v, list) else [v])]
    return [i for i in flat if isinstance(i, int)]


def load_hf(directory, placement=None):
    """Loaded(config, weights, tokenizer, chat template, notices) for an HF model directory; each tensor goes to
    `placement` (refllama.xp.Placement; default: NumPy) as it is read."""
    from .tokenizer import from_hf_dir

    d = Path(directory)
    c = Config(d / "config.json")
    names = c.get("architectures")
    if not isinstance(names, list) or not names:
        raise RefllamaError(f"{c.path}: missing field 'architectures'")
    arch = archs.for_hf(names[0], c.path)
    cfg, rope = arch.config_from_hf(c)
    ck = Checkpoint(d)
    weights = read_weights(arch, cfg, "hf", ck.tensor, lambda name: name in ck, placement or Placement())
    weights.update(rope)
    tokenizer, template = from_hf_dir(d, eos_ids(c, d))
    return Loaded(cfg, weights, tokenizer, template, [])
