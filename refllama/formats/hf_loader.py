"""Hugging Face model directories: config.json, safetensors (single or sharded, memory-mapped), tokenizer.

The architecture module that `architectures[0]` names reads the config and the weights table (refllama.arch);
every layout transform from HF's tensors to refllama's is listed in `arch.tables.read_weights`.
"""

import math
import os
import struct
from pathlib import Path

import numpy as np

from ..errors import RefllamaError, shown
from .ggml_types import GGMLType, QuantizedTensor
from .safety import check_regular, inside, parse_json, read_json

PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "consolidated.00.pth")
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
_FORMS = {"F16": GGMLType.F16, "BF16": GGMLType.BF16}  # safetensors dtypes a matrix can stay in
# a U8 tensor is packed MXFP4 (blocks and scales, 17 bytes a 32 values): kept as is, or 128/17 float32 bytes a byte


NUMBER = (int, float)


class Config:
    """config.json with errors that name the file and the field: a JSON object (refllama.formats.safety's limits), each
    field read checked for its type."""

    def __init__(self, path):
        self.path = path
        if not Path(path).exists():
            raise RefllamaError(f"{path}: missing (an HF model directory needs config.json)")
        self.d = read_json(path)

    def _typed(self, key, value, kind):
        if kind is not None and (not isinstance(value, kind) or (isinstance(value, bool) and bool not in kind)):
            raise RefllamaError(f"{self.path}: field '{key}' has the wrong type ({shown(value)})")
        return value

    def need(self, key, kind=NUMBER):
        if key not in self.d or self.d[key] is None:
            raise RefllamaError(f"{self.path}: missing field '{key}'")
        return self._typed(key, self.d[key], kind)

    def get(self, key, default=None, kind=None):
        """The field, or `default` if absent or null; `kind`: the types it may have (bool only if named)."""
        value = self.d.get(key)
        return default if value is None else self._typed(key, value, kind)

    def nested(self, key):  # -> the Config of an object field (a multimodal model's text_config)
        sub = object.__new__(Config)
        sub.path, sub.d = f"{self.path}: {key}", self.need(key, dict)
        return sub


class SafeTensors:
    """Tensors of one .safetensors file, memory-mapped; F32, F16 and BF16 (which safetensors' numpy API lacks).
    The header is validated by the safetensors library itself (offsets contiguous, non-overlapping, covering the
    data exactly, sizes matching shapes and dtypes) before refllama reads a byte of data."""

    def __init__(self, path):
        from safetensors import safe_open

        self.path = str(path)
        check_regular(self.path)
        try:
            with safe_open(self.path, framework="numpy"):
                pass
        except Exception as e:  # safetensors raises its own SafetensorError (and OSError for I/O)
            raise RefllamaError(f"{self.path}: not a valid safetensors file ({shown(str(e), 120)})") from None
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = parse_json(f.read(n), self.path)
        self.metadata = header.pop("__metadata__", None) or {}  # str -> str, by the format
        self.entries, self.base = header, 8 + n
        self.buf = np.memmap(self.path, dtype=np.uint8, mode="r") if size > self.base else np.zeros(0, np.uint8)

    def __contains__(self, name):
        return name in self.entries

    def packed(self, name):  # -> uint8 array: a quantizer's bytes (gpt-oss's MXFP4 blocks and scales), as stored
        e = self.entries[name]
        if e["dtype"] != "U8":
            raise RefllamaError(f"{self.path}: tensor {shown(name)} has dtype {shown(e['dtype'])}, expected U8 "
                                "(a quantizer's packed bytes)")
        begin, end = e["data_offsets"]
        return self.buf[self.base + begin:self.base + end].reshape(tuple(e["shape"]))

    def tensor(self, name, keep=frozenset()):
        """Tensor `name` in float32, or in its stored form (QuantizedTensor) if it is an F16/BF16 matrix whose type is
        in `keep`; F32 matrices stay a view of the memory map."""
        e = self.entries[name]
        if e["dtype"] not in _DTYPES:
            raise RefllamaError(f"{self.path}: tensor {shown(name)} has unsupported dtype {shown(e['dtype'])} "
                                "(F32, F16, BF16)")
        begin, end = e["data_offsets"]
        raw, shape = self.buf[self.base + begin:self.base + end], tuple(e["shape"])
        if e["dtype"] == "F32":
            values = raw.view(np.float32).reshape(shape)
            return values if len(shape) == 2 else values.copy()
        rows = shape[0] if len(shape) == 2 else 1  # a vector converts as one row
        stored = QuantizedTensor(raw.reshape(rows, -1), _FORMS[e["dtype"]], (rows, math.prod(shape) // rows))
        if len(shape) == 2 and stored.qtype in keep:
            return stored
        return stored.to_float32().reshape(shape)


class Checkpoint:
    """All tensors of a directory: model.safetensors, or the shards named by model.safetensors.index.json (names
    that must stay inside the directory and be regular files)."""

    def __init__(self, directory):
        d = Path(directory)
        index = d / "model.safetensors.index.json"
        if index.exists():
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise RefllamaError(f"{index}: field 'weight_map' must map tensor names to file names")
            files = {}
            for shard in sorted(set(weight_map.values())):
                path = inside(d, shard, index)
                if not path.exists():
                    raise RefllamaError(f"{path}: missing shard (listed in {index.name})")
                files[shard] = SafeTensors(path)
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

    def float32_bytes(self, keep):
        """The memory the tensors take once read: float32 for all but the matrices kept as stored (`keep`)."""
        total = 0
        for name, st in self.where.items():
            e = st.entries.get(name)
            if e is not None and not (len(e["shape"]) == 2 and _FORMS.get(e["dtype"]) in keep):
                total += (4 if e["dtype"] != "U8" else 1 if GGMLType.MXFP4 in keep else 128 / 17
                          ) * math.prod(e["shape"])
        return int(total)

    def tensor(self, name, shape, keep=frozenset(), packed=False):
        """Tensor `name` of numpy shape `shape` (`packed`: a quantizer's uint8 bytes, as stored)."""
        if name not in self.where:
            raise RefllamaError(f"{self.dir}: missing tensor {shown(name)}")
        st = self.where[name]
        if name not in st:
            raise RefllamaError(f"{st.path}: missing tensor {shown(name)} (the shard index lists it here)")
        if tuple(st.entries[name]["shape"]) != tuple(shape):
            got = st.entries[name]["shape"]
            raise RefllamaError(f"{st.path}: tensor {shown(name)} has shape {list(got)}, expected {list(shape)}")
        return st.packed(name) if packed else st.tensor(name, keep)


def eos_ids(c, directory):
    """End-of-generation ids named by config.json (already read) and generation_config.json: an int or a list."""
    ids = [c.get("eos_token_id", kind=(int, list))]
    if (Path(directory) / "generation_config.json").exists():
        ids.append(Config(Path(directory) / "generation_config.json").get("eos_token_id", kind=(int, list)))
    flat = [i for v in ids for i in (v if isinstance(v, list) else [v])]
    return [i for i in flat if isinstance(i, int) and not isinstance(i, bool)]
