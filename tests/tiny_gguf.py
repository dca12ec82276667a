"""Tiny llama GGUF files written with gguf.GGUFWriter, for loader and tokenizer tests."""

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT
from tokenizers import pre_tokenizers

# A tiny llama: dims are multiples of 256 so every quantized type (K-quants have 256-wide blocks) fits a row.
TINY = dict(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=256, n_ctx=64)
_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he")]
TINY_TOKENS = sorted(pre_tokenizers.ByteLevel.alphabet()) + ["Ġt", "he", "Ġthe", "<|endoftext|>"]


def tiny_metadata(c=TINY):
    """Metadata of the tiny model (or of dims `c`, TINY's keys) as {key: (value, type)}; tests delete or change
    entries to break it."""
    types = [1] * (len(TINY_TOKENS) - 1) + [3]
    return {
        "llama.block_count": (c["n_layer"], VT.UINT32),
        "llama.context_length": (c["n_ctx"], VT.UINT32),
        "llama.embedding_length": (c["n_embd"], VT.UINT32),
        "llama.feed_forward_length": (c["n_ff"], VT.UINT32),
        "llama.attention.head_count": (c["n_head"], VT.UINT32),
        "llama.attention.head_count_kv": (c["n_head_kv"], VT.UINT32),
        "llama.rope.freq_base": (10000.0, VT.FLOAT32),
        "llama.attention.layer_norm_rms_epsilon": (1e-5, VT.FLOAT32),
        "tokenizer.ggml.model": ("gpt2", VT.STRING),
        "tokenizer.ggml.pre": ("gpt-2", VT.STRING),
        "tokenizer.ggml.tokens": (TINY_TOKENS, VT.ARRAY),
        "tokenizer.ggml.token_type": (types, VT.ARRAY),
        "tokenizer.ggml.merges": ([f"{a} {b}" for a, b in _MERGES], VT.ARRAY),
        "tokenizer.ggml.bos_token_id": (len(TINY_TOKENS) - 1, VT.UINT32),
        "tokenizer.ggml.eos_token_id": (len(TINY_TOKENS) - 1, VT.UINT32),
    }


def tiny_tensor_shapes(c=TINY):
    """numpy shapes [rows, cols] of the tiny model's tensors (or of dims `c`)."""
    V = len(TINY_TOKENS)
    D, F, HD = c["n_embd"], c["n_ff"], c["n_embd"] // c["n_head"]
    shapes = {"token_embd.weight": (V, D), "output_norm.weight": (D,)}
    for i in range(c["n_layer"]):
        shapes.update({
            f"blk.{i}.attn_norm.weight": (D,), f"blk.{i}.attn_q.weight": (c["n_head"] * HD, D),
            f"blk.{i}.attn_k.weight": (c["n_head_kv"] * HD, D), f"blk.{i}.attn_v.weight": (c["n_head_kv"] * HD, D),
            f"blk.{i}.attn_output.weight": (D, c["n_head"] * HD), f"blk.{i}.ffn_norm.weight": (D,),
            f"blk.{i}.ffn_gate.weight": (F, D), f"blk.{i}.ffn_up.weight": (F, D), f"blk.{i}.ffn_down.weight": (D, F),
        })
    return shapes


def random_tensor(shape, qtype, rng):
    """Random raw data for a tensor of numpy shape `shape` stored as `qtype` (bytes for quantized types).

    Quantized blocks get bytes in [0, 0x3B], so every float16 scale inside them is finite and below 1.
    """
    if qtype == QT.F32:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)
    if qtype == QT.F16:
        return (rng.standard_normal(shape) * 0.1).astype(np.float16)
    return rng.integers(0, 0x3C, size=gguf.quant_shape_to_byte_shape(shape, qtype), dtype=np.uint8)


def write_gguf(path, metadata, tensors, arch="llama"):
    """Write a GGUF file: metadata {key: (value, type)}, tensors {name: (array, qtype)}."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, (value, vtype) in metadata.items():
        sub = None
        if vtype == VT.ARRAY:
            sub = {str: VT.STRING, float: VT.FLOAT32, int: VT.INT32}[type(value[0])]
        w.add_key_value(key, value, vtype, sub)
    for name, (array, qtype) in tensors.items():
        if qtype in (QT.F32, QT.F16):
            w.add_tensor(name, array)
        else:
            w.add_tensor(name, array, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_tensors(qtype=QT.F32, seed=0, c=TINY):
    """{name: (raw array, qtype)}: matrices stored as `qtype`, norms as F32 (dims `c`: TINY's keys)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in tiny_tensor_shapes(c).items():
        t = QT.F32 if len(shape) == 1 else qtype
        out[name] = (np.ones(shape, np.float32) if t == QT.F32 and len(shape) == 1 else random_tensor(shape, t, rng), t)
    return out
