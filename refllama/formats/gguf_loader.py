"""GGUF loading: the header parsed, the config and weights read through the architecture's tables, every tensor
checked by name and shape; float32, or left in its GGUF bytes for a backend that multiplies quantized.

Weights keep GGUF's row layout [out, in] (numpy order), q/k rows in the RoPE pair layout llama.cpp uses for the
architecture (which is how its converter wrote them).
"""

import math
import os
from typing import NamedTuple

import numpy as np

from ..errors import RefllamaError, shown
from .ggml_types import FLOATS, INTEGERS, SCALAR_DTYPES, SUPPORTED_TYPES, GGMLType, QuantizedTensor, type_and_sizes
from .ggml_types import GGUFValueType as V
from .safety import check_regular

STRING, ARRAY, UINT32, BOOL, UINT64, INT64 = V.STRING, V.ARRAY, V.UINT32, V.BOOL, V.UINT64, V.INT64
MAX_DIMS, MAX_NAME = 4, 64  # GGML_MAX_DIMS; GGML_MAX_NAME (a name must be shorter)
TYPE_NAMES = {**{t: "integer" for t in INTEGERS}, **{t: "float" for t in FLOATS}, BOOL: "bool", STRING: "string",
              ARRAY: "array"}


class TensorInfo(NamedTuple):
    name: str
    tensor_type: GGMLType  # or gguf-py's enum member, for a type refllama does not read
    shape: tuple  # GGUF order: fastest-varying dimension first
    n_bytes: int
    data_offset: int


class Field(NamedTuple):
    vtype: int  # GGUF value type; an array's is its items' type
    is_array: bool
    value: object


class _Cursor:
    """Reads GGUF's little-endian header fields; running off the end is a 'truncated' error, and no count read
    from the file is trusted before the bytes it needs are known to be there."""

    def __init__(self, buf, path):
        self.buf, self.pos, self.path = buf, 0, path

    def fail(self, what):
        raise RefllamaError(f"{self.path}: {what}")

    def take(self, n):
        if self.pos + n > len(self.buf):
            self.fail(f"truncated GGUF file (header ends at byte {len(self.buf)})")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, vtype):
        dt = np.dtype(SCALAR_DTYPES[vtype])
        v = np.frombuffer(self.take(dt.itemsize), dt)[0]
        return bool(v) if vtype == BOOL else v.item()

    def count(self, item_size, what):
        """A count of items of at least item_size bytes each, refused if the rest of the file cannot hold them."""
        n = self.scalar(UINT64)
        if n * item_size > len(self.buf) - self.pos:
            self.fail(f"{what} claims {n} entries, more than the {len(self.buf) - self.pos} bytes left can hold")
        return n

    def string(self):
        return self.strings(1)[0]

    def strings(self, n):  # n strings (a vocabulary's 100k+ tokens and merges: one tight loop, not n calls)
        buf, pos, out = self.buf, self.pos, []
        for _ in range(n):
            if pos + 8 > len(buf) or pos + 8 + (k := int.from_bytes(buf[pos:pos + 8], "little")) > len(buf):
                self.pos = pos
                self.fail(f"truncated GGUF file (header ends at byte {len(buf)})")
            out.append(str(buf[pos + 8:pos + 8 + k], "utf-8", "replace"))
            pos += 8 + k
        self.pos = pos
        return out

    def field(self, key):
        vtype = self.scalar(UINT32)
        if vtype == ARRAY:
            item = self.scalar(UINT32)
            if item == STRING:
                return Field(item, True, self.strings(self.count(8, f"array '{key}'")))
            if item not in SCALAR_DTYPES:
                self.fail(f"metadata field {shown(key)} is an array of unsupported type {item}")
            dt = np.dtype(SCALAR_DTYPES[item])
            values = np.frombuffer(self.take(dt.itemsize * self.count(dt.itemsize, f"array '{key}'")), dt)
            return Field(item, True, values.tolist())
        if vtype == STRING:
            return Field(vtype, False, self.string())
        if vtype not in SCALAR_DTYPES:
            self.fail(f"metadata field {shown(key)} has unsupported value type {vtype}")
        return Field(vtype, False, self.scalar(vtype))

    def tensor_info(self):
        """(name, type, sizes, shape, offset) of one tensor, each checked as llama.cpp's gguf.cpp checks it."""
        name = self.string()
        if len(name.encode()) >= MAX_NAME:
            self.fail(f"tensor name {shown(name)} is longer than {MAX_NAME - 1} bytes")
        n_dims = self.scalar(UINT32)
        if not 1 <= n_dims <= MAX_DIMS:
            self.fail(f"tensor {shown(name)} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        shape = tuple(self.scalar(INT64) for _ in range(n_dims))
        if any(n < 1 for n in shape):
            self.fail(f"tensor {shown(name)} has shape {list(shape)}: every dimension must be at least 1")
        raw_type, offset = self.scalar(UINT32), self.scalar(UINT64)
        known = type_and_sizes(raw_type)
        if known is None:
            self.fail(f"tensor {shown(name)} has unknown type {raw_type}")
        qtype, (block, type_size) = known
        if shape[0] % block:
            self.fail(f"tensor {shown(name)} of type {qtype.name} has rows of {shape[0]} values, not a multiple "
                      f"of its block of {block}")
        n_bytes = math.prod(shape) // block * type_size
        if n_bytes > len(self.buf):
            self.fail(f"tensor {shown(name)} of shape {list(shape)} needs {n_bytes} bytes, more than the whole file")
        return name, qtype, shape, n_bytes, offset


class GGUFFile:
    """An opened GGUF file: typed metadata access and tensors by name, errors naming the file and the field.

    The header is parsed here rather than with gguf-py's GGUFReader, which builds a NumPy view per vocabulary
    string (seconds and a hundred MB for a 100k-token vocabulary); gguf-py still does the dequantizing. Everything
    llama.cpp's gguf.cpp refuses is refused (duplicate keys and names, more than 4 dimensions, rows that are not
    whole blocks, an alignment that is not a power of two), and more: every count is checked against the bytes
    left before it is used, tensor data must be aligned, inside the file and not overlap. Parsing reads the
    header only, so its time depends on the header's size, not the file's.
    `fallbacks` collects the quantized types that `tensor` was asked to keep but dequantized, for a one-line notice.
    """

    def __init__(self, path):
        self.path = str(path)
        self.fallbacks = set()
        if not os.path.exists(self.path):
            raise RefllamaError(f"{self.path}: no such model file")
        check_regular(self.path)
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
        if n_kv * 13 + n_tensors * 25 > size:  # the smallest key-value pair and tensor entry
            c.fail(f"header claims {n_kv} metadata fields and {n_tensors} tensors, more than a file of {size} "
                   "bytes can hold")
        self.fields = {}
        for _ in range(n_kv):
            key = c.string()
            if not key or key in self.fields:
                c.fail(f"{'empty' if not key else 'duplicate'} metadata key {shown(key)}")
            self.fields[key] = c.field(key)
        infos = {}
        for _ in range(n_tensors):
            name, *rest = c.tensor_info()
            if name in infos:
                c.fail(f"duplicate tensor {shown(name)}")
            infos[name] = rest
        align = self.integer("general.alignment", 32, kinds=(UINT32,))
        if align & (align - 1):
            c.fail(f"general.alignment {align} is not a power of two")
        start = (c.pos + align - 1) // align * align
        self.tensors = {n: TensorInfo(n, t, sh, nb, start + off) for n, (t, sh, nb, off) in infos.items()}
        end = start
        for t in sorted(self.tensors.values(), key=lambda t: t.data_offset):
            if (t.data_offset - start) % align:
                c.fail(f"tensor {shown(t.name)} data at offset {t.data_offset - start} is not aligned to {align}")
            if t.data_offset < end:
                c.fail(f"tensor {shown(t.name)} data overlaps the tensor before it")
            end = t.data_offset + t.n_bytes
            if end > size:
                c.fail(f"truncated GGUF file: tensor {shown(t.name)} ends past the end of the file")

    def _field(self, key, required, kinds, what, array=False):
        f = self.fields.get(key)
        if f is None:
            if required:
                raise RefllamaError(f"{self.path}: missing metadata field '{key}'")
            return None
        if f.vtype not in kinds or f.is_array != array:
            name = TYPE_NAMES.get(f.vtype, "unknown")
            got = f"an array of {name}s" if f.is_array else f"{'an' if name[0] in 'aiu' else 'a'} {name}"
            raise RefllamaError(f"{self.path}: metadata field '{key}' must be {what}, got {got}")
        return f.value

    def has(self, key):
        return key in self.fields

    def integer(self, key, default=None, low=1, high=2 ** 63, kinds=INTEGERS):
        """An integer field in [low, high]; required unless `default` is given."""
        v = self._field(key, default is None, kinds, "an integer")
        if v is None:
            return default
        if not low <= v <= high:
            raise RefllamaError(f"{self.path}: metadata field '{key}' is {v}, outside [{low}, {high}]")
        return v

    def real(self, key, default=None, low=-math.inf, high=math.inf, positive=False):
        """A finite number in [low, high] (and > 0 if `positive`); required unless `default` is given."""
        v = self._field(key, default is None, (*FLOATS, *INTEGERS), "a number")
        if v is None:
            return default
        if not math.isfinite(v) or not low <= v <= high or (positive and v <= 0):
            rule = "positive" if positive else f"in [{low}, {high}]"
            raise RefllamaError(f"{self.path}: metadata field '{key}' is {v}; it must be finite and {rule}")
        return float(v)

    def string(self, key, default=None, required=False):
        v = self._field(key, required, (STRING,), "a string")
        return default if v is None else v

    def flag(self, key, default):
        v = self._field(key, False, (BOOL,), "a bool")
        return default if v is None else v

    def array(self, key, kinds, what, required=False):
        """An array field's values (kinds: its items' GGUF types, `what` says them), or None if absent."""
        return self._field(key, required, kinds, f"an array of {what}", array=True)

    def token_id(self, key, n_tokens):
        """A token id field: None if absent, else an integer naming one of the n_tokens tokens."""
        return self.integer(key, -1, low=0, high=n_tokens - 1) if self.has(key) else None

    def raw(self, t):
        """The bytes of tensor t, shaped [rows, row bytes] as gguf-py's dequantize wants them: F32 tensors
        copied, others a memory map of the tensor alone, which the caller converts and drops.

        A map rather than a read into a malloc'd buffer: freeing a buffer of many MB makes glibc raise its
        threshold for serving allocations with their own mappings, and the activations of every later prefill
        then stay in the heap once freed."""
        data = np.memmap(self.path, dtype=np.uint8, mode="r", offset=t.data_offset, shape=(t.n_bytes,))
        if t.tensor_type == GGMLType.F32:
            return np.array(data).view(np.float32).reshape(tuple(reversed(t.shape)))
        rows = math.prod(t.shape[1:])
        return data.reshape(rows, -1)

    def tensor(self, name, shape, keep_quantized=frozenset()):
        """Tensor `name` with numpy shape `shape`, or a clear error: float32, or its GGUF bytes (QuantizedTensor) if
        it is a matrix (or a 3-D tensor of experts' matrices) of a type in `keep_quantized`."""
        t = self.tensors.get(name)
        if t is None:
            raise RefllamaError(f"{self.path}: missing tensor {shown(name)}")
        got = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dims fastest-first
        if [n for n in got if n != 1] == [n for n in shape if n != 1]:
            got = tuple(shape)  # a vector with or without an axis of one (llama.cpp's quantizer drops it)
        if got != tuple(shape):
            raise RefllamaError(f"{self.path}: tensor {shown(name)} has shape {list(got)}, expected {list(shape)}")
        if t.tensor_type not in SUPPORTED_TYPES:
            raise RefllamaError(f"{self.path}: tensor {shown(name)} has unsupported type {t.tensor_type.name}")
        if t.tensor_type == GGMLType.F32:
            return self.raw(t).reshape(shape)
        stored = QuantizedTensor(self.raw(t), t.tensor_type, tuple(shape))
        if len(shape) in (2, 3) and t.tensor_type in keep_quantized:
            return stored
        if keep_quantized and t.tensor_type not in (GGMLType.F16, GGMLType.BF16):
            self.fallbacks.add(t.tensor_type.name)
        return stored.to_float32()
