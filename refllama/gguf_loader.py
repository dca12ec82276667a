"""GGUF loading: model config from metadata, every tensor checked by name and shape, then dequantized.

Weights keep GGUF's row layout [out, in] (numpy order); q/k rows keep GGUF's interleaved RoPE pairs.
"""

import os

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from gguf.quants import dequantize

from .config import ModelConfig
from .errors import RefllamaError

SUPPORTED_TYPES = frozenset(
    (QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0,
     QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K)
)
ARCHITECTURES = ("llama",)


class GGUFFile:
    """An opened GGUF file: typed metadata access and tensors by name, errors naming the file.

    `keep_quantized`: matrices of these types stay quantized (refllama.quant.QuantMatrix) instead of being
    dequantized to float32; `fallbacks` collects the other quantized types met, for a one-line notice.
    """

    def __init__(self, path, keep_quantized=frozenset()):
        self.path = str(path)
        self.keep_quantized, self.fallbacks = keep_quantized, set()
        if not os.path.isfile(self.path):
            raise RefllamaError(f"{self.path}: no such model file")
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise RefllamaError(f"{self.path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
        try:
            self.reader = GGUFReader(self.path)
        except Exception as e:  # gguf-py raises ValueError/IndexError/KeyError on malformed files
            raise RefllamaError(f"{self.path}: malformed or truncated GGUF file ({type(e).__name__}: {e})") from None
        self.tensors = {t.name: t for t in self.reader.tensors}
        size = os.path.getsize(self.path)
        for t in self.reader.tensors:
            if t.data_offset + t.n_bytes > size:
                raise RefllamaError(f"{self.path}: truncated GGUF file: tensor '{t.name}' ends past the end of the file")

    def get(self, key, default=None, required=False):
        field = self.reader.fields.get(key)
        if field is None:
            if required:
                raise RefllamaError(f"{self.path}: missing metadata field '{key}'")
            return default
        try:
            return field.contents()
        except Exception as e:
            raise RefllamaError(f"{self.path}: unreadable metadata field '{key}' ({e})") from None

    def tensor(self, name, shape):
        """Tensor `name` as float32 with numpy shape `shape`, or a clear error."""
        t = self.tensors.get(name)
        if t is None:
            raise RefllamaError(f"{self.path}: missing tensor '{name}'")
        got = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dims fastest-first
        if got != tuple(shape):
            raise RefllamaError(f"{self.path}: tensor '{name}' has shape {list(got)}, expected {list(shape)}")
        if t.tensor_type not in SUPPORTED_TYPES:
            raise RefllamaError(f"{self.path}: tensor '{name}' has unsupported type {t.tensor_type.name}")
        if t.tensor_type == QT.F32:
            return np.asarray(t.data, dtype=np.float32).reshape(shape)  # a view of the memory map
        if len(shape) == 2 and t.tensor_type in self.keep_quantized:
            from .quant import QuantMatrix

            return QuantMatrix(np.asarray(t.data), t.tensor_type, shape)
        if self.keep_quantized and t.tensor_type not in (QT.F16, QT.BF16):
            self.fallbacks.add(t.tensor_type.name)
        return dequantize(t.data, t.tensor_type).astype(np.float32, copy=False).reshape(shape)


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


def read_weights(g, cfg):
    """All weights as float32 numpy arrays, shapes checked against cfg (numpy order [out, in])."""
    D, H, KVH, HD, F, V = cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_ff, cfg.vocab_size
    w = {
        "token_embd": g.tensor("token_embd.weight", (V, D)),
        "output_norm": g.tensor("output_norm.weight", (D,)),
    }
    w["output"] = w["token_embd"] if cfg.tied_output else g.tensor("output.weight", (V, D))
    if "rope_freqs.weight" in g.tensors:  # llama3-style per-frequency scaling, stored by the converter
        w["rope_freqs"] = g.tensor("rope_freqs.weight", (cfg.rope_dim // 2,))
    shapes = {
        "attn_norm": (D,), "attn_q": (H * HD, D), "attn_k": (KVH * HD, D), "attn_v": (KVH * HD, D),
        "attn_output": (D, H * HD), "ffn_norm": (D,), "ffn_gate": (F, D), "ffn_up": (F, D), "ffn_down": (D, F),
    }
    w["layers"] = [
        {name: g.tensor(f"blk.{i}.{name}.weight", shape) for name, shape in shapes.items()}
        for i in range(cfg.n_layer)
    ]
    return w


def load_gguf(path, keep_quantized=frozenset()):
    """(GGUFFile, ModelConfig, weights) for a llama-architecture GGUF file."""
    g = GGUFFile(path, keep_quantized)
    cfg = read_config(g)
    return g, cfg, read_weights(g, cfg)
