"""Export a GGUF model as a Hugging Face directory: safetensors, config.json, tokenizer files.

    python -m refllama.convert model.gguf out_dir/ [--dtype f32|f16|bf16] [--shard-gb 5]

Weights are converted to float32 (float16, bfloat16) one tensor at a time from the memory-mapped file, so a model
far larger than memory converts, and written in shards of at most --shard-gb with HF's index (one
model.safetensors when one shard holds it all); they are named by the architecture's table (refllama.arch), q/k rows
put back in HF's half-split RoPE layout where llama.cpp's converter had permuted them, fused tensors fused as HF
stores them; the tokenizer is the GGUF vocabulary in `tokenizers`' terms (hf_tokenizer). The directory loads in
refllama and in transformers (`AutoModelForCausalLM.from_pretrained(out_dir)`). Written to a temporary directory
and renamed, so a failed export leaves nothing behind.
"""

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from . import arch as archs
from .arch.tables import HF_LAYER, dims
from .cli import parser
from .errors import RefllamaError
from .layers import yarn_mscale
from .loader import load_gguf
from .numerics.ggml_tables import bf16_bits
from .numerics.matrices import FileMatrix, FilePlacement
from .pairs import permute_rows


def float32(t):
    """A weight as a float32 array: a file-form matrix (refllama.numerics.matrices.FileMatrix) converted now."""
    return t.stored.to_float32() if isinstance(t, FileMatrix) else np.asarray(t, np.float32)


DTYPES = {"f32": ("float32", lambda a: a), "f16": ("float16", lambda a: a.astype(np.float16)),
          "bf16": ("bfloat16", bf16_bits)}  # --dtype: (config's torch_dtype, the conversion from float32)


def hf_tensors(cfg, w):
    """(HF name, shape, function giving its float32 array) for each tensor, through the architecture's tables in
    reverse; nothing is converted until the function is called."""
    arch, d = archs.get(cfg.arch), dims(cfg)

    def give(row, source, prefix):
        if row.hf is None or (row.key == "output" and cfg.tied_output):
            return None
        parts = [key for key, _ in row.split] if row.split else [row.key]
        if not all(key in source for key in parts):
            return None  # an optional tensor the model does not have
        shape = (sum(source[key].shape[0] for key in parts), *source[parts[0]].shape[1:])

        def values():
            t = np.concatenate([float32(source[key]) for key in parts]) if row.split else float32(source[row.key])
            return permute_rows(t, d[row.hf_permute], cfg.rope_dim, "half") if row.hf_permute else t

        return prefix + row.hf, shape, values

    rows = [give(row, w, "") for row in arch.WEIGHTS]
    for i, lw in enumerate(w["layers"]):
        rows += [give(row, lw, HF_LAYER.format(i=i)) for row in arch.LAYER_WEIGHTS]
    return [r for r in rows if r is not None]


def write_shards(tensors, directory, dtype, shard_bytes):
    """The tensors in shards of at most `shard_bytes` (a larger tensor alone in its own), each converted just before
    its shard is written and dropped after: model.safetensors, or model-0000i-of-0000n.safetensors and the index."""
    cast = DTYPES[dtype][1]
    width = np.dtype(np.float32 if dtype == "f32" else np.float16).itemsize
    shards, size = [[]], 0
    for name, shape, values in tensors:
        n = int(np.prod(shape)) * width
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, values))
        size += n
    files = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))])
    weight_map, total = {}, 0
    for file, shard in zip(files, shards, strict=True):
        arrays = {name: np.ascontiguousarray(cast(values())) for name, values in shard}
        total += sum(a.nbytes for a in arrays.values())
        if dtype == "bf16":  # safetensors' NumPy API has no bfloat16: write the bits, then name the dtype
            save_bf16(arrays, directory / file)
        else:
            save_file(arrays, str(directory / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(arrays, file))
        del arrays
    if len(files) > 1:
        (directory / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1) + "\n", encoding="utf-8")


def save_bf16(arrays, path):
    """A safetensors file of bfloat16 tensors given as their uint16 bits: the format's header and the bytes."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, a in arrays.items():
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for a in arrays.values():
            f.write(a.tobytes())


EXPORTABLE = ("llama", "qwen2", "qwen3", "phi3")  # the families whose config.json this writes


def hf_config(cfg, tok, dtype_name, w):
    if cfg.arch not in EXPORTABLE:
        raise RefllamaError(f"export of {cfg.arch} models is not supported (supported: {', '.join(EXPORTABLE)})")
    if any(cfg.moe_layers or ()):  # Mixtral is a `llama` file: refused here, before any tensor is written
        raise RefllamaError("export of mixture-of-experts models is not supported (this model has experts)")
    if any(k in w for k in ("rope_freqs", "rope_factors_short")):
        raise RefllamaError("export supports plain and linear RoPE only (this model has per-frequency factors)")
    rope = {"rope_theta": cfg.rope_base, "rope_type": "default"}
    if cfg.rope_yarn:
        beta_fast, beta_slow, truncate = cfg.rope_yarn
        rope = {"rope_theta": cfg.rope_base, "rope_type": "yarn", "factor": cfg.rope_scale,
                "original_max_position_embeddings": cfg.rope_ctx_orig, "beta_fast": beta_fast, "beta_slow": beta_slow,
                "attention_factor": cfg.rope_attn_factor * yarn_mscale(cfg.rope_scale), "truncate": truncate}
    elif cfg.rope_scale != 1.0:
        rope = {"rope_theta": cfg.rope_base, "rope_type": "linear", "factor": cfg.rope_scale}
    arch = archs.get(cfg.arch)
    return {
        "architectures": [arch.HF_ARCHITECTURES[0]], "model_type": cfg.arch, "hidden_size": cfg.n_embd,
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_head_kv,
        "head_dim": cfg.head_dim, "intermediate_size": cfg.n_ff, "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.n_ctx_train, "rms_norm_eps": cfg.rms_eps, "hidden_act": "silu",
        "rope_theta": cfg.rope_base, "rope_scaling": None if rope["rope_type"] == "default" else rope,
        "tie_word_embeddings": cfg.tied_output, "attention_bias": "attn_q_bias" in w["layers"][0],
        "mlp_bias": "ffn_up_bias" in w["layers"][0], "sliding_window": cfg.sliding_window,
        "bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "torch_dtype": dtype_name,
    }


def convert(gguf_path, out_dir, dtype="f32", shard_gb=5.0):
    """Write the HF directory for a GGUF file; returns its path."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise RefllamaError(f"{out}: output directory exists and is not empty")
    if dtype not in DTYPES:
        raise RefllamaError(f"unsupported --dtype {dtype!r} ({', '.join(DTYPES)})")
    if not shard_gb > 0:
        raise RefllamaError(f"--shard-gb must be positive, got {shard_gb}")
    cfg, w, tok, template, _ = load_gguf(gguf_path, FilePlacement(in_file=True))  # every matrix mapped, as stored
    config = hf_config(cfg, tok, DTYPES[dtype][0], w)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=out.parent))
    try:
        write_shards(hf_tensors(cfg, w), tmp, dtype, int(shard_gb * 1e9))
        (tmp / "config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
        (tmp / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": tok.bos_id, "eos_token_id": sorted(tok.eog_ids)}, indent=1) + "\n", encoding="utf-8")
        hf_tokenizer(tok).save(str(tmp / "tokenizer.json"))
        text = tok.token_text
        (tmp / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": text(tok.bos_id) if tok.bos_id is not None else None,
            "eos_token": text(tok.eos_id) if tok.eos_id is not None else None,
            "add_bos_token": tok.add_bos, "add_eos_token": tok.add_eos,
            "chat_template": template,
        }, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        for f in tmp.iterdir():
            f.chmod(0o644)
        tmp.chmod(0o755)  # mkdtemp makes it private
        if out.exists():
            out.rmdir()
    except BaseException:  # nothing half-written is left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    os.replace(tmp, out)
    return out


def hf_tokenizer(tok):
    """A `tokenizers.Tokenizer` for a GGUF vocabulary (formats.tokenizer.GgufTokenizer): BPE with its merges and
    pre-tokenizer regexes, or SentencePiece as BPE with merges ranked by score and byte fallback; control and
    user-defined tokens as added tokens. `tokenizers` cannot state every llama.cpp rule (tie order, lstrip/rstrip
    by model name), so this is the form transformers reads, not refllama's own tokenizer."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    from .formats.tokenizer import A_CONTROL, A_UNKNOWN, A_USER_DEFINED, Spm

    vocab, algo = tok.vocab, tok.algo
    if isinstance(algo, Spm):
        ids = [(s, a, b) for piece, s in zip(tok.tokens, algo.scores, strict=True) for cut in range(1, len(piece))
               if (a := vocab.get(piece[:cut])) is not None and (b := vocab.get(piece[cut:])) is not None]
        ids.sort(key=lambda m: (-m[0], m[1], m[2]))
        unk = next((t for t, a in zip(tok.tokens, tok.attrs, strict=True) if a & A_UNKNOWN), None)
        hf = Tokenizer(BPE(vocab, [(tok.tokens[a], tok.tokens[b]) for _, a, b in ids], byte_fallback=True,
                           fuse_unk=True, unk_token=unk))
        hf.normalizer = normalizers.Sequence([*([normalizers.Prepend("▁")] if tok.space_prefix else []),
                                              normalizers.Replace(" ", "▁")])
        steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
        hf.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if tok.space_prefix else steps)
    elif algo.byte_level:
        pairs = ((tok.tokens[a], tok.tokens[b]) for a, b in algo.ranks.pairs())
        merges = [(a, b) for a, b in pairs if a + b in vocab]
        hf = Tokenizer(BPE(vocab, merges, ignore_merges=algo.ignore_merges))
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(e), behavior="isolated") for e in algo.exprs]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        hf.decoder = decoders.ByteLevel()
    else:
        raise RefllamaError("no tokenizer.json form for a Gemma 4 vocabulary (SentencePiece-style BPE)")
    hf.add_tokens([AddedToken(t, special=bool(a & A_CONTROL), normalized=False)
                   for t, a in zip(tok.tokens, tok.attrs, strict=True) if a & (A_CONTROL | A_USER_DEFINED)])
    return hf


def main(argv=None):
    p = parser("refllama.convert", __doc__)
    p.add_argument("gguf", help="GGUF model file")
    p.add_argument("out_dir", help="directory to create")
    p.add_argument("--dtype", default="f32", choices=DTYPES, help="the weights' type (default %(default)s)")
    p.add_argument("--shard-gb", type=float, default=5.0, help="largest shard in GB (default %(default)s, as HF)")
    args = p.parse_args(argv)
    try:
        out = convert(args.gguf, args.out_dir, args.dtype, args.shard_gb)
    except RefllamaError as e:
        print(f"refllama.convert: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
