"""A second, independent Llama engine, written from checkpoints/FORMAT.md as another engine's author would write
one: the GGUF read by gguf-py (not refllama's loader), q/k rows put back in HF's order (pairs (i, i + HD/2)), its
own forward in NumPy, and a dump writer. `bugs` injects the mistakes engine authors make, so the tests can check
that `python -m refllama.compare` names each at its own stage.

Bugs: pair_layout (rotate pairs (2i, 2i+1) of HF-ordered q/k), eps (1e-6 for the model's 1e-5), gqa (query head h
reads kv head h % KVH), softmax_scale (1/HD), theta (500000), gelu (for silu), bf16_residual (the residual stream
rounded to bfloat16), swap_gate_up_7 (block 7 reads ffn_up for ffn_gate and back), decode_position (a decode step
rotates by its position + 1), no_causal_mask. `numerics="bfloat16"` rounds the weights and every stage's output
to bfloat16 (a correct bf16 engine).
"""

import json
import struct
from pathlib import Path

import gguf
import numpy as np


def bf16(x):
    """x rounded to the nearest bfloat16 (ties to even), kept as float32."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def field(reader, key):
    f = reader.fields[key]
    v = f.parts[f.data[0]]
    return bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else v[0].item()


def unpermute(w, n_head):  # llama.cpp's converter interleaved each head's rows; HF pairs (i, i + HD/2)
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def permute(w, n_head):  # the reverse: HF's rows back to the converter's
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, -1).swapaxes(1, 2).reshape(w.shape)


class Weights:
    def __init__(self, path):
        r = gguf.GGUFReader(path)
        self.path = str(path)
        self.n_layer = field(r, "llama.block_count")
        self.H, self.KVH = field(r, "llama.attention.head_count"), field(r, "llama.attention.head_count_kv")
        self.D = field(r, "llama.embedding_length")
        self.HD = self.D // self.H
        self.eps, self.theta = field(r, "llama.attention.layer_norm_rms_epsilon"), field(r, "llama.rope.freq_base")
        t = {x.name: gguf.quants.dequantize(x.data, x.tensor_type).astype(np.float32) for x in r.tensors}
        for i in range(self.n_layer):
            t[f"blk.{i}.attn_q.weight"] = unpermute(t[f"blk.{i}.attn_q.weight"], self.H)
            t[f"blk.{i}.attn_k.weight"] = unpermute(t[f"blk.{i}.attn_k.weight"], self.KVH)
        t.setdefault("output.weight", t["token_embd.weight"])
        self.t = t


class Engine:
    def __init__(self, weights, bugs=(), numerics="float32", half=None):
        """`half`: float32, but the embedding rows and the KV cache in float16 (the common mixed precision), its
        precision declared in the manifest (half="declared") or not (half="undeclared")."""
        self.w, self.bugs, self.numerics, self.half = weights, set(bugs), numerics, half
        self.round = bf16 if numerics == "bfloat16" else (lambda x: np.asarray(x, np.float32))
        self.t = {k: self.round(v) for k, v in weights.t.items()} if numerics == "bfloat16" else weights.t
        if "unpermuted_weights" in self.bugs:  # GGUF's q/k rows as the converter left them, under HF's RoPE
            self.t = dict(self.t)
            for i in range(weights.n_layer):
                for name, n in (("attn_q", weights.H), ("attn_k", weights.KVH)):
                    self.t[f"blk.{i}.{name}.weight"] = permute(self.t[f"blk.{i}.{name}.weight"], n)

    def mm(self, x, name):
        return self.round(x @ self.t[name].T)

    def norm(self, x, name):
        eps = 1e-6 if "eps" in self.bugs else self.w.eps
        return self.round(x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * self.t[name])

    def rope(self, x, positions):  # [T, n, HD], pairs (i, i + HD/2) as HF orders them
        hd = x.shape[-1]
        theta = 500000.0 if "theta" in self.bugs else self.w.theta
        ang = np.asarray(positions, np.float64)[:, None] * theta ** (-np.arange(0, hd, 2) / hd)  # [T, HD/2]
        cos, sin = np.cos(ang)[:, None].astype(np.float32), np.sin(ang)[:, None].astype(np.float32)
        if "pair_layout" in self.bugs:
            a, b = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
            return self.round(out)
        a, b = x[..., :hd // 2], x[..., hd // 2:]
        return self.round(np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1))

    def run(self, ids, decode_steps=0):
        """Stages of the prefill of `ids`, then of each greedy decode step: [(positions, {name: array})]."""
        w, H, KVH, HD = self.w, self.w.H, self.w.KVH, self.w.HD
        cache = {i: (np.zeros((0, KVH, HD), np.float32),) * 2 for i in range(w.n_layer)}
        records, tokens = [], list(ids)
        for step in range(decode_steps + 1):
            start = 0 if step == 0 else len(tokens) - 1
            new = tokens[start:]
            pos = list(range(start, start + len(new)))
            rot = [p + 1 for p in pos] if step and "decode_position" in self.bugs else pos
            s = {}
            x = s["inp_embd"] = self.round(self.t["token_embd.weight"][new])
            if self.half:
                x = s["inp_embd"] = x.astype(np.float16).astype(np.float32)
            for i in range(w.n_layer):
                blk = f"blk.{i + 1 if 'neighbour_layer_7' in self.bugs and i == 7 else i}."
                h = s[f"attn_norm-{i}"] = self.norm(x, blk + "attn_norm.weight")
                q = s[f"Qcur-{i}"] = self.mm(h, blk + "attn_q.weight").reshape(len(new), H, HD)
                k = s[f"Kcur-{i}"] = self.mm(h, blk + "attn_k.weight").reshape(len(new), KVH, HD)
                v = s[f"Vcur-{i}"] = self.mm(h, blk + "attn_v.weight").reshape(len(new), KVH, HD)
                q = s[f"Qcur_rope-{i}"] = self.rope(q, rot)
                k = s[f"Kcur_rope-{i}"] = self.rope(k, rot)
                stored = (k, v) if not self.half else (k.astype(np.float16).astype(np.float32),
                                                       v.astype(np.float16).astype(np.float32))
                ks, vs = (np.concatenate([c, n]) for c, n in zip(cache[i], stored, strict=True))
                cache[i] = (ks, vs)
                kv = np.arange(H) % KVH if "gqa" in self.bugs else np.arange(H) // (H // KVH)
                kq = s[f"kq-{i}"] = self.round(np.einsum("thd,shd->hts", q, ks[:, kv]))  # [H, T, S]
                scale = 1 / HD if "softmax_scale" in self.bugs else 1 / np.sqrt(HD)
                visible = np.arange(len(ks))[None, :] <= np.asarray(pos)[:, None] + ("mask_off_by_one" in self.bugs)
                z = kq * scale + (0 if "no_causal_mask" in self.bugs else np.where(visible, 0, -np.inf))
                e = np.exp(z - z.max(-1, keepdims=True))
                p = s[f"kq_soft_max-{i}"] = self.round(e / e.sum(-1, keepdims=True))
                o = s[f"kqv_out-{i}"] = self.round(np.einsum("hts,shd->thd", p, vs[:, kv]).reshape(len(new), -1))
                a = s[f"attn_out-{i}"] = self.mm(o, blk + "attn_output.weight")
                x = s[f"ffn_inp-{i}"] = self.residual(a if "no_attn_residual_5" in self.bugs and i == 5 else x + a)
                h = s[f"ffn_norm-{i}"] = self.norm(x, blk + "ffn_norm.weight")
                swap = "swap_gate_up_7" in self.bugs and i == 7
                gate, up = ("ffn_up", "ffn_gate") if swap else ("ffn_gate", "ffn_up")
                g = s[f"ffn_gate-{i}"] = self.mm(h, f"{blk}{gate}.weight")
                u = s[f"ffn_up-{i}"] = self.mm(h, f"{blk}{up}.weight")
                act = 0.5 * g * (1 + np.tanh(0.7978845608 * (g + 0.044715 * g ** 3))) if "gelu" in self.bugs \
                    else g / (1 + np.exp(-g))
                f = s[f"ffn_swiglu-{i}"] = self.round(act * u)
                d = s[f"ffn_out-{i}"] = self.mm(f, blk + "ffn_down.weight")
                x = s[f"l_out-{i}"] = self.residual(x + d)
            s["result_norm"] = x if "no_final_norm" in self.bugs else self.norm(x, "output_norm.weight")
            logits = s["result_output"] = self.mm(s["result_norm"], "output.weight")
            records.append((pos, s))
            tokens.append(int(logits[-1].argmax()))
        return records, tokens[len(ids):len(ids) + decode_steps]

    def residual(self, x):
        return bf16(x) if "bf16_residual" in self.bugs else self.round(x)

    def dump(self, ids, path, decode_steps=0, form="directory"):
        """Write the run in refllama's dump format: `form` "directory" (.npy files, manifest.json) or
        "safetensors" (one file, manifest fields in its metadata, q/k/v as [T, H*HD], a batch axis, bfloat16)."""
        records, decode_ids = self.run(ids, decode_steps)
        manifest = {"format": "refllama-dump/1", "producer": f"tests/engine.py ({self.numerics})",
                    "model_sha256": "", "token_ids": list(ids), "decode_ids": decode_ids,
                    "qk_layout": "interleaved" if "manifest_layout" in self.bugs else "half",
                    "numerics": self.numerics,
                    **({"rounded": {"inp_embd": "float16"}, "kv_cache": "float16"} if self.half == "declared" else {})}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if form == "directory":
            path.mkdir()
            tensors = []
            for positions, stages in records:
                for name, a in stages.items():
                    file = f"{name}@{positions[0]}.npy"
                    np.save(path / file, a.astype(np.float32))
                    tensors.append({"name": name, "file": file, "positions": positions})
            (path / "manifest.json").write_text(json.dumps({**manifest, "tensors": tensors}))
        else:
            arrays = {}
            for positions, stages in records:
                for name, a in stages.items():
                    a = a.reshape(len(a), -1) if name.split("-")[0] in ("Qcur", "Kcur", "Vcur") else a
                    arrays[name if positions[0] == 0 else f"{name}@{positions[0]}"] = a[None]
            write_safetensors_bf16(path, arrays, {k: json.dumps(v) if isinstance(v, list) else str(v)
                                                  for k, v in manifest.items()})
        return path


def write_safetensors_bf16(path, arrays, metadata):
    """A .safetensors file of bfloat16 tensors, written by hand: NumPy has no bfloat16 for safetensors' own writer."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, a in arrays.items():
        raw = (bf16(a).view(np.uint32) >> 16).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
