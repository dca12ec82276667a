"""Hugging Face model directories: config.json, safetensors (single or sharded, memory-mapped), tokenizer.

Architectures are Llama and its relatives, each a small difference handled here or in the one model file:
Mistral (sliding-window attention), Qwen2 (q/k/v biases), Phi-3 (fused qkv and gate_up projections,
LongRoPE). Every layout transform from HF's tensors to refllama's is listed in `read_weights`.
"""

import json
import math
import os
import struct
from pathlib import Path

import numpy as np

from .config import ModelConfig
from .errors import RefllamaError

ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
                 "Phi3ForCausalLM": "phi3"}
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


def rope_parameters(c):
    """(theta, scaling dict or {}) from transformers 5's `rope_parameters` or transformers 4's
    top-level `rope_theta` + `rope_scaling`."""
    params = c.get("rope_parameters")
    if isinstance(params, dict):
        if "rope_theta" not in params:
            raise RefllamaError(f"{c.path}: missing field 'rope_parameters.rope_theta'")
        return float(params["rope_theta"]), params
    return float(c.need("rope_theta")), c.get("rope_scaling", {})


def llama3_freq_factors(theta, rope_dim, s, path):
    """Per-frequency divisors of Llama 3.1's RoPE scaling (transformers' _compute_llama3_parameters)."""
    try:
        factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
        old_ctx = float(s["original_max_position_embeddings"])
    except KeyError as e:
        raise RefllamaError(f"{path}: rope scaling 'llama3' lacks field {e}") from None
    inv_freq = theta ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    scaled = np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    return inv_freq / scaled


def read_config(c):
    """ModelConfig and RoPE frequency factors (or None) from an HF config.json."""
    archs = c.get("architectures")
    if not isinstance(archs, list) or not archs:
        raise RefllamaError(f"{c.path}: missing field 'architectures'")
    if archs[0] not in ARCHITECTURES:
        raise RefllamaError(f"{c.path}: unsupported architectures '{archs[0]}' (supported: {', '.join(ARCHITECTURES)})")
    arch = ARCHITECTURES[archs[0]]
    D, H = c.need("hidden_size", int), c.need("num_attention_heads", int)
    # the only defaults taken are transformers' own documented ones, for fields older configs omit
    KVH = c.get("num_key_value_heads", H)
    HD = c.get("head_dim", D // H)
    rope_dim = int(HD * c.get("partial_rotary_factor", 1.0))
    theta, s = rope_parameters(c)
    kind = s.get("rope_type", s.get("type", "default")) if s else "default"
    n_ctx = c.need("max_position_embeddings", int)
    freq_factors, linear_scale, attn_factor = None, 1.0, 1.0
    if kind == "linear":
        linear_scale = float(s["factor"])
    elif kind == "llama3":
        freq_factors = llama3_freq_factors(theta, rope_dim, s, c.path)
    elif kind in ("longrope", "su"):  # Phi-3: the short factors, valid up to the original context
        original = int(s.get("original_max_position_embeddings") or c.need("original_max_position_embeddings", int))
        freq_factors = np.asarray(s["short_factor"], dtype=np.float64)
        factor = s.get("factor") or n_ctx / original
        attn_factor = s.get("attention_factor") or (
            1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original)))
        n_ctx = original
    elif kind != "default":
        raise RefllamaError(f"{c.path}: unsupported rope scaling type '{kind}' (supported: default, linear, llama3, longrope)")
    if freq_factors is not None and len(freq_factors) != rope_dim // 2:
        raise RefllamaError(f"{c.path}: rope scaling has {len(freq_factors)} factors, expected {rope_dim // 2}")
    window = c.get("sliding_window") if arch == "mistral" else None
    if arch == "qwen2" and c.get("use_sliding_window", False):
        raise RefllamaError(f"{c.path}: unsupported option 'use_sliding_window': true (Qwen2)")
    if c.get("hidden_act", "silu") != "silu":
        raise RefllamaError(f"{c.path}: unsupported hidden_act '{c.get('hidden_act')}' (supported: silu)")
    cfg = ModelConfig(
        arch=arch, n_layer=c.need("num_hidden_layers", int), n_embd=D, n_head=H, n_head_kv=KVH, head_dim=HD,
        n_ff=c.need("intermediate_size", int), vocab_size=c.need("vocab_size", int), n_ctx_train=n_ctx,
        rms_eps=float(c.need("rms_norm_eps")), rope_base=theta, rope_dim=rope_dim,
        rope_scaling="none" if kind == "default" else kind, rope_scale=linear_scale, rope_attn_factor=attn_factor,
        rope_layout="interleaved", tied_output=bool(c.get("tie_word_embeddings", False)),
        sliding_window=int(window) if window else None,
    )
    return cfg, freq_factors


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
        header.pop("__metadata__", None)
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
            raise RefllamaError(f"{self.path}: tensor '{name}' holds {raw.size} values, its shape {e['shape']} needs more")
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


def interleave_rows(w, n_heads, rope_dim):  # [n*HD, ...] -> same, rows of each head reordered
    """HF pairs dims (i, i + R/2) of a head for RoPE; refllama (like GGUF) pairs (2i, 2i+1): reorder rows."""
    hd = w.shape[0] // n_heads
    half = rope_dim // 2
    order = np.concatenate([np.stack([np.arange(half), np.arange(half) + half], axis=1).ravel(), np.arange(rope_dim, hd)])
    return w.reshape(n_heads, hd, *w.shape[1:])[:, order].reshape(w.shape)


def read_weights(ck, cfg):
    """refllama's weight dict from HF tensor names. Layout transforms, all of them:
    - q and k rows (and Qwen2's q/k biases): HF's half-split RoPE pairs -> interleaved, per head;
    - Phi-3 `qkv_proj` split into q, k, v rows; `gate_up_proj` split into gate (first F rows) and up;
    - no transposes: HF Linear weights are [out, in], as refllama keeps them."""
    D, H, KVH, HD, F, V = cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_ff, cfg.vocab_size
    w = {"token_embd": ck.tensor("model.embed_tokens.weight", (V, D)),
         "output_norm": ck.tensor("model.norm.weight", (D,))}
    w["output"] = w["token_embd"] if cfg.tied_output else ck.tensor("lm_head.weight", (V, D))
    w["layers"] = []
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        lw = {"attn_norm": ck.tensor(p + "input_layernorm.weight", (D,)),
              "ffn_norm": ck.tensor(p + "post_attention_layernorm.weight", (D,)),
              "attn_output": ck.tensor(p + "self_attn.o_proj.weight", (D, H * HD)),
              "ffn_down": ck.tensor(p + "mlp.down_proj.weight", (D, F))}
        if cfg.arch == "phi3":
            qkv = ck.tensor(p + "self_attn.qkv_proj.weight", ((H + 2 * KVH) * HD, D))
            lw["attn_q"], lw["attn_k"], lw["attn_v"] = np.split(qkv, [H * HD, (H + KVH) * HD])
            lw["ffn_gate"], lw["ffn_up"] = np.split(ck.tensor(p + "mlp.gate_up_proj.weight", (2 * F, D)), 2)
        else:
            for ours, theirs, rows in (("attn_q", "q_proj", H * HD), ("attn_k", "k_proj", KVH * HD),
                                       ("attn_v", "v_proj", KVH * HD)):
                lw[ours] = ck.tensor(f"{p}self_attn.{theirs}.weight", (rows, D))
                if f"{p}self_attn.{theirs}.bias" in ck:  # Qwen2 (and Llama with attention_bias)
                    lw[ours + "_bias"] = ck.tensor(f"{p}self_attn.{theirs}.bias", (rows,))
            lw["ffn_gate"] = ck.tensor(p + "mlp.gate_proj.weight", (F, D))
            lw["ffn_up"] = ck.tensor(p + "mlp.up_proj.weight", (F, D))
        for ours, theirs, shape in (("attn_output_bias", "self_attn.o_proj.bias", (D,)),
                                    ("ffn_gate_bias", "mlp.gate_proj.bias", (F,)),
                                    ("ffn_up_bias", "mlp.up_proj.bias", (F,)), ("ffn_down_bias", "mlp.down_proj.bias", (D,))):
            if p + theirs in ck:  # Llama's attention_bias / mlp_bias options
                lw[ours] = ck.tensor(p + theirs, shape)
        for name, n in (("attn_q", H), ("attn_k", KVH), ("attn_q_bias", H), ("attn_k_bias", KVH)):
            if name in lw:
                lw[name] = interleave_rows(lw[name], n, cfg.rope_dim)
        w["layers"].append(lw)
    return w


def eos_ids(c, directory):
    """End-of-generation ids named by config.json (already read) and generation_config.json: an int or a list."""
    ids = [c.get("eos_token_id")]
    if (Path(directory) / "generation_config.json").exists():
        ids.append(Config(Path(directory) / "generation_config.json").get("eos_token_id"))
    flat = [i for v in ids for i in (v if isinstance(v, list) else [v])]
    return [i for i in flat if isinstance(i, int)]


def load_hf(directory):
    """(ModelConfig, weights, end-of-generation ids) for an HF model directory."""
    d = Path(directory)
    c = Config(d / "config.json")
    cfg, freq_factors = read_config(c)
    w = read_weights(Checkpoint(d), cfg)
    if freq_factors is not None:
        w["rope_freqs"] = freq_factors.astype(np.float32)
    return cfg, w, eos_ids(c, d)
