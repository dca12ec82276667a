"""GGUF loading: model config from metadata, every tensor checked by name and shape, then dequantized.

Weights keep GGUF's row layout [out, in] (numpy order); q/k rows keep GGUF's interleaved RoPE pairs.
"""

import math
import os
from enum import IntEnum
from typing import NamedTuple

import numpy as np

from .config import ModelConfig
from .errors import RefllamaError

ARCHITECTURES = ("llama",)


class GGMLType(IntEnum):
    """ggml's ids of the tensor types refllama reads (ggml.h, `enum ggml_type`). gguf-py has them all, but
    importing its package loads every module of it and, where installed, SentencePiece: 2 MB to 3.4 MB of
    memory that the numba path, which calls no gguf-py function for the default model, would carry to the end.
    gguf-py is imported where one of its functions is needed: dequantizing, Q4_K's scales, naming a type
    refllama does not read. tests/test_gguf_loader.py checks this table against gguf-py's."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    BF16 = 30


SUPPORTED_TYPES = frozenset(GGMLType)
BLOCK_SIZES = {  # type: (values per block, bytes per block)
    GGMLType.F32: (1, 4), GGMLType.F16: (1, 2), GGMLType.BF16: (1, 2),
    GGMLType.Q4_0: (32, 18), GGMLType.Q4_1: (32, 20), GGMLType.Q5_0: (32, 22), GGMLType.Q5_1: (32, 24),
    GGMLType.Q8_0: (32, 34), GGMLType.Q2_K: (256, 84), GGMLType.Q3_K: (256, 110), GGMLType.Q4_K: (256, 144),
    GGMLType.Q5_K: (256, 176), GGMLType.Q6_K: (256, 210),
}


def byte_shape(shape, qtype):  # numpy shape [..., K] of a supported type -> its bytes' shape [..., row bytes]
    block, type_size = BLOCK_SIZES[qtype]
    return (*shape[:-1], shape[-1] // block * type_size)


def _type_and_sizes(raw_type):
    """(type, (values per block, bytes per block)) for a raw type id: refllama's own for the types it reads,
    else gguf-py's, so that the error names the type when a tensor of it is asked for; None if unknown."""
    if raw_type in BLOCK_SIZES:
        return GGMLType(raw_type), BLOCK_SIZES[raw_type]
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        qtype = GGMLQuantizationType(raw_type)
    except ValueError:
        return None
    return qtype, GGML_QUANT_SIZES[qtype]


_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
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
            known = _type_and_sizes(raw_type)
            if known is None:
                raise RefllamaError(f"{self.path}: tensor '{name}' has unknown type {raw_type}")
            qtype, (block, type_size) = known
            infos.append((name, qtype, shape, math.prod(shape) // block * type_size, offset))
        align = self.fields.get("general.alignment", 32)
        start = (c.pos + align - 1) // align * align
        self.tensors = {n: TensorInfo(n, t, sh, nb, start + off) for n, t, sh, nb, off in infos}
        for t in self.tensors.values():
            if t.data_offset + t.n_bytes > size:
                raise RefllamaError(f"{self.path}: truncated GGUF file: tensor '{t.name}' ends past the end of the file")

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
        """Tensor `name` with numpy shape `shape`, or a clear error: float32, or a QuantMatrix if it is a matrix
        of a type in `keep_quantized`."""
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
            from .quant import QuantMatrix

            return QuantMatrix(self.raw(t), t.tensor_type, shape)
        if keep_quantized and t.tensor_type not in (GGMLType.F16, GGMLType.BF16):
            self.fallbacks.add(t.tensor_type.name)
        from gguf.quants import dequantize

        return dequantize(self.raw(t), t.tensor_type).astype(np.float32, copy=False).reshape(shape)


def read_config(g):
    """ModelConfig from GGUF metadata (`{arch}.*` keys, as llama.cpp reads them)."""
    arch = g.get("general.architecture", required=True)
    if arch not in ARCHITECTURES:
        raise RefllamaError(f"{g.path}: unsupported general.architecture '{arch}' (supported: {', '.join(ARCHITECTURES)})")

    def key(name, default=None, required=True):
        return g.get(f"{arch}.{name}", default, required and default is None)

    n_embd = int(key("embedding_length"))
    n_head = int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", n_embd // n_head))
    n_tokens = len(g.get("tokenizer.ggml.tokens", [])) or None
    vocab = g.get(f"{arch}.vocab_size", n_tokens)
    if vocab is None:
        raise RefllamaError(f"{g.path}: missing metadata field '{arch}.vocab_size' (and no tokenizer.ggml.tokens)")
    scaling = g.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", "linear"):
        raise RefllamaError(f"{g.path}: unsupported {arch}.rope.scaling.type '{scaling}' (supported: none, linear)")
    factor = float(g.get(f"{arch}.rope.scaling.factor", 1.0) or 1.0)
    return ModelConfig(
        arch=arch,
        n_layer=int(key("block_count")),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=int(key("attention.head_count_kv", n_head)),
        head_dim=head_dim,
        n_ff=int(key("feed_forward_length")),
        vocab_size=int(vocab),
        n_ctx_train=int(key("context_length")),
        rms_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_base=float(key("rope.freq_base", 10000.0)),  # llama.cpp's default when absent
        rope_dim=int(key("rope.dimension_count", head_dim)),
        rope_scaling="linear" if scaling == "linear" and factor != 1.0 else "none",
        rope_scale=factor if scaling == "linear" else 1.0,
        rope_layout="interleaved",
        tied_output="output.weight" not in g.tensors,
    )


def read_weights(g, cfg, keep_quantized=frozenset()):
    """All weights, shapes checked against cfg (numpy order [out, in]): float32 numpy arrays, except matrices
    of the `keep_quantized` types, which stay quantized (refllama.quant.QuantMatrix)."""
    D, H, KVH, HD, F, V = cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_ff, cfg.vocab_size
    w = {
        "token_embd": g.tensor("token_embd.weight", (V, D), keep_quantized),
        "output_norm": g.tensor("output_norm.weight", (D,)),
    }
    w["output"] = w["token_embd"] if cfg.tied_output else g.tensor("output.weight", (V, D), keep_quantized)
    if "rope_freqs.weight" in g.tensors:  # llama3-style per-frequency scaling, stored by the converter
        w["rope_freqs"] = g.tensor("rope_freqs.weight", (cfg.rope_dim // 2,))
    shapes = {
        "attn_norm": (D,), "attn_q": (H * HD, D), "attn_k": (KVH * HD, D), "attn_v": (KVH * HD, D),
        "attn_output": (D, H * HD), "ffn_norm": (D,), "ffn_gate": (F, D), "ffn_up": (F, D), "ffn_down": (D, F),
    }
    w["layers"] = [
        {name: g.tensor(f"blk.{i}.{name}.weight", shape, keep_quantized) for name, shape in shapes.items()}
        for i in range(cfg.n_layer)
    ]
    return w


def load_gguf(path):
    """(GGUFFile, ModelConfig, float32 weights) for a llama-architecture GGUF file."""
    g = GGUFFile(path)
    cfg = read_config(g)
    return g, cfg, read_weights(g, cfg)
