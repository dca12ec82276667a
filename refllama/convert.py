"""Export a GGUF model as a Hugging Face directory: safetensors, config.json, tokenizer files.

    python -m refllama.convert model.gguf out_dir/ [--dtype f32|f16]

Weights are dequantized to float32 (or float16), q/k rows are put back in HF's half-split RoPE layout, and
the tokenizer is the one refllama builds from the GGUF vocabulary. The directory loads in refllama and in
transformers (`AutoModelForCausalLM.from_pretrained(out_dir)`). Written to a temporary directory and renamed,
so a failed export leaves nothing behind.
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from .errors import RefllamaError
from .gguf_loader import load_gguf
from .hf_loader import interleave_rows
from .tokenizer import from_gguf

HF_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
            "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
            "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


def half_split_rows(w, n_heads, rope_dim):
    """Inverse of hf_loader.interleave_rows: refllama's interleaved q/k rows -> HF's half-split rows."""
    hd = w.shape[0] // n_heads
    probe = interleave_rows(np.arange(n_heads * hd), n_heads, rope_dim)[:hd]  # where each row came from
    return w.reshape(n_heads, hd, *w.shape[1:])[:, np.argsort(probe)].reshape(w.shape)


def hf_tensors(cfg, w, dtype):
    out = {"model.embed_tokens.weight": w["token_embd"], "model.norm.weight": w["output_norm"]}
    if not cfg.tied_output:
        out["lm_head.weight"] = w["output"]
    for i, lw in enumerate(w["layers"]):
        for name, hf in HF_NAMES.items():
            t = lw[name]
            if name in ("attn_q", "attn_k"):
                t = half_split_rows(t, cfg.n_head if name == "attn_q" else cfg.n_head_kv, cfg.rope_dim)
            out[f"model.layers.{i}.{hf}.weight"] = t
    return {k: np.ascontiguousarray(v, dtype=dtype) for k, v in out.items()}


def hf_config(cfg, tok, dtype_name, rope_freqs):
    if cfg.rope_scaling not in ("none", "linear") or rope_freqs is not None:
        raise RefllamaError("export supports plain and linear RoPE only (this model has per-frequency factors)")
    rope = {"rope_theta": cfg.rope_base, "rope_type": "default"}
    if cfg.rope_scaling == "linear":
        rope = {"rope_theta": cfg.rope_base, "rope_type": "linear", "factor": cfg.rope_scale}
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": cfg.n_embd,
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_head_kv,
        "head_dim": cfg.head_dim, "intermediate_size": cfg.n_ff, "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.n_ctx_train, "rms_norm_eps": cfg.rms_eps, "hidden_act": "silu",
        "rope_theta": cfg.rope_base, "rope_scaling": None if rope["rope_type"] == "default" else rope,
        "tie_word_embeddings": cfg.tied_output, "attention_bias": False, "mlp_bias": False,
        "bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "torch_dtype": dtype_name,
    }


def convert(gguf_path, out_dir, dtype="f32"):
    """Write the HF directory for a GGUF file; returns its path."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise RefllamaError(f"{out}: output directory exists and is not empty")
    if dtype not in ("f32", "f16"):
        raise RefllamaError(f"unsupported --dtype {dtype!r} (f32 or f16)")
    g, cfg, w = load_gguf(gguf_path)
    tok = from_gguf(g)
    np_dtype, dtype_name = (np.float32, "float32") if dtype == "f32" else (np.float16, "float16")
    config = hf_config(cfg, tok, dtype_name, w.get("rope_freqs"))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=out.parent))
    save_file(hf_tensors(cfg, w, np_dtype), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    (tmp / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": tok.bos_id, "eos_token_id": sorted(tok.eog_ids)}, indent=1) + "\n", encoding="utf-8")
    tok.tok.encode_special_tokens = False
    tok.tok.save(str(tmp / "tokenizer.json"))
    text = tok.token_text
    (tmp / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": text(tok.bos_id) if tok.bos_id is not None else None,
        "eos_token": text(tok.eos_id) if tok.eos_id is not None else None,
        "add_bos_token": tok.add_bos, "add_eos_token": tok.add_eos,
        "chat_template": g.get("tokenizer.chat_template"),
    }, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    for f in tmp.iterdir():
        f.chmod(0o644)
    tmp.chmod(0o755)  # mkdtemp makes it private
    if out.exists():
        out.rmdir()
    os.replace(tmp, out)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m refllama.convert", description=__doc__.splitlines()[0])
    p.add_argument("gguf", help="GGUF model file")
    p.add_argument("out_dir", help="directory to create")
    p.add_argument("--dtype", default="f32", help="f32 (default) or f16")
    args = p.parse_args(argv)
    try:
        out = convert(args.gguf, args.out_dir, args.dtype)
    except RefllamaError as e:
        print(f"refllama.convert: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
