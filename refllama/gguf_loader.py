"""GGUF loading: the header parsed, the config and weights read through the architecture's tables, every tensor
checked by name and shape; float32, or left in its GGUF bytes for a backend that multiplies quantized.

Weights keep GGUF's row layout [out, in] (numpy order), q/k rows in the RoPE pair layout llama.cpp uses for the
architecture (which is how its converter wrote them).
"""

import math
import os
from typing import NamedTuple

import numpy as np

from . import arch as archs
from .arch.common import read_weights
from .config import Loaded
from .errors import RefllamaError
from .ggml_types import SUPPORTED_TYPES, GGMLType, QuantizedTensor, type_and_sizes
from .xp import Placement

_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
            12: "<f8"}
STRING, ARRAY = 8, 9


class TensorInfo(NamedTuple):
    name: str
    tensor_type: GGMLType  # or gguf-py's enum member, for a type refllama does not read
    shape: tuple  # GGUF order: fastest-varying dimension first
    n_bytes: int
    data_offset: int


class _Cursor:
    """Reads GGUF's little-endian header fields; running off the end is a 'truncated' error."""

    def __init__(self, buf, path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n):
        if self.pos + n > len(self.buf):
            raise RefllamaError(f"{self.path}: truncated GGUF file (header ends at byte {len(self.buf)})")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, vtype):
        dt = np.dtype(_SCALARS[vtype])
        v = np.frombuffer(self.take(dt.itemsize), dt)[0]
        return bool(v) if vtype == 7 else v.item()

    def string(self):
        return str(self.take(self.scalar(10)), "utf-8", "replace")

    def value(self, vtype):
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            item, count = self.scalar(4), self.scalar(10)
            if item == STRING:
                return [self.string() for _ in range(count)]
            if item not in _SCALARS:
                raise RefllamaError(f"{self.path}: unsupported metadata array type {item}")
            dt = np.dtype(_SCALARS[item])
            return np.frombuffer(self.take(dt.itemsize * count), dt).tolist()
        if vtype not in _SCALARS:
            raise RefllamaError(f"{self.path}: unsupported metadata value type {vtype}")
        return self.scalar(vtype)


class GGUFFile:
    """An opened GGUF file: typed metadata access and tensors by name, errors naming the file.

    The header is parsed here rather than with gguf-py's GGUFReader, which builds a NumPy view per vocabulary
    string (2.5 s and 160 MB for SmolLM2's 98k strings); gguf-py still does the dequantizing.
    `fallbacks` collects the quantized types that `tensor` was asked to keep but dequantized, for a one-line notice.
    """

    def __init__(self, path):
        self.path = str(path)
        self.fallbacks = set()
        if not os.path.isfile(self.path):
            raise RefllamaError(f"{self.path}: no such model file")
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as f:
            magic = f.read(4)
            if magic != b"GGUF":
                raise RefllamaError(f"{self.path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
            header = np.memmap(f, dtype=np.uint8, mode="r")  # only the header pages are ever read through it
        c = _Cursor(memoryview(header), self.path)
        c.take(4)
        version = c.scalar(4)
        if version not in (2, 3):
            raise RefllamaError(f"{self.path}: unsupported GGUF version {version} (big-endian or newer file?)")
        n_tensors, n_kv = c.scalar(10), c.scalar(10)
        self.fields = {}
        for _ in range(n_kv):
            key = c.string()
            self.fields[key] = c.value(c.scalar(4))
        infos = []
        for _ in range(n_tensors):
            name, n_dims = c.string(), c.scalar(4)
            shape = tuple(c.scalar(10) for _ in range(n_dims))
            raw_type, offset = c.scalar(4), c.scalar(10)
            known = type_and_sizes(raw_type)
            if known is None:
                raise RefllamaError(f"{self.path}: tensor '{name}' has unknown type {raw_type}")
            qtype, (block, type_size) = known
            infos.append((name, qtype, shape, math.prod(shape) // block * type_size, offset))
        align = self.fields.get("general.alignment", 32)
        start = (c.pos + align - 1) // align * align
        self.tensors = {n: TensorInfo(n, t, sh, nb, start + off) for n, t, sh, nb, off in infos}
        for t in self.tensors.values():
            if t.data_offset + t.n_bytes > size:
                raise RefllamaError(f"{self.path}: truncated GGUF file: tensor '{t.name}' ends past the end of the "
                                    "file")

    def get(self, key, default=None, required=False):
        if key not in self.fields:
            if required:
                raise RefllamaError(f"{self.path}: missing metadata field '{key}'")
            return default
        return self.fields[key]

    def raw(self, t):
        """The bytes of tensor t, shaped [rows, row bytes] as gguf-py's dequantize wants them: F32 tensors
        copied, others a memory map of the tensor alone, which the caller converts and drops.

        A map rather than a read into a malloc'd buffer: freeing a buffer of many MB makes glibc raise its
        threshold for serving allocations with their own mappings, and the activations of every later prefill
        then stay in the heap once freed (measured: numba backend, peak RSS 1 MB higher)."""
        data = np.memmap(self.path, dtype=np.uint8, mode="r", offset=t.data_offset, shape=(t.n_bytes,))
        if t.tensor_type == GGMLType.F32:
            return np.array(data).view(np.float32).reshape(tuple(reversed(t.shape)))
        rows = math.prod(t.shape[1:])
        return data.reshape(rows, -1)

    def tensor(self, name, shape, keep_quantized=frozenset()):
        """Tensor `name` with numpy shape `shape`, or a clear error: float32, or its GGUF bytes (QuantizedTensor) if
        it is a matrix of a type in `keep_quantized`."""
        t = self.tensors.get(name)
        if t is None:
            raise RefllamaError(f"{self.path}: missing tensor '{name}'")
        got = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dims fastest-first
        if got != tuple(shape):
            raise RefllamaError(f"{self.path}: tensor '{name}' has shape {list(got)}, expected {list(shape)}")
        if t.tensor_type not in SUPPORTED_TYPES:
            raise RefllamaError(f"{self.path}: tensor '{name}' has unsupported type {t.tensor_type.name}")
        if t.tensor_type == GGMLType.F32:
            return self.raw(t).reshape(shape)
        if len(shape) == 2 and t.tensor_type in keep_quantized:
            return QuantizedTensor(self.raw(t), t.tensor_type, tuple(shape))
        if keep_quantized and t.tensor_type not in (GGMLType.F16, GGMLType.BF16):
            self.fallbacks.add(t.tensor_type.name)
        from gguf.quants import dequantize

        return dequantize(self.raw(t), t.tensor_type).astype(np.float32, copy=False).reshape(shape)


def load_gguf(path, placement=None):
    """Loaded(config, weights, tokenizer, chat template, notices) for a GGUF file: the architecture module its
    `general.architecture` names reads the config and the weights table. Each tensor goes to `placement`
    (refllama.xp.Placement; default: NumPy) as it is read: float32, or for matrices of its `keep` types their
    GGUF bytes (QuantizedTensor)."""
    from .tokenizer import from_gguf

    g = GGUFFile(path)
    arch = archs.for_gguf(g.get("general.architecture", required=True), g.path)
    cfg = arch.config_from_gguf(g)
    tokenizer, template = from_gguf(g), g.get("tokenizer.chat_template")
    # the tokenizer holds the vocabulary now: free its ~100k Python strings before the weights arrive
    g.fields = {k: v for k, v in g.fields.items() if not k.startswith("tokenizer.ggml.")}
    placement = placement or Placement()
    placement.prepare({t.tensor_type for t in g.tensors.values() if len(t.shape) == 2})
    weights = read_weights(arch, cfg, "gguf", lambda name, shape: g.tensor(name, shape, placement.keep),
                           lambda name: name in g.tensors, placement)
    types = ", ".join(sorted(g.fallbacks))
    notices = [f"no {{backend}} kernel for {types}: those tensors are dequantized to float32"] if types else []
    return Loaded(cfg, weights, tokenizer, template, notices)
