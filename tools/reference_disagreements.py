"""Measure where transformers and llama.cpp disagree on the tiny models of tools/make_tiny_gguf.py, and which one
refllama follows: each case is a family's tiny model, its config changed as a real model's may be, saved by
transformers, converted by llama.cpp's converter (F32), run by both references (float32, llama.cpp's F32 cache) and by
refllama from the HF directory and from the GGUF file. Prints the table of docs/references.md.

    python tools/reference_disagreements.py --llama-cpp /tmp/llama-cpp-python-0.3.36/vendor/llama.cpp   # ~1 minute
Needs torch==2.13.0, transformers, llama-cpp-python 0.3.36 and the same version's sdist (README).
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import dump_llamacpp
import llama_cpp
import numpy as np
import torch
from make_tiny_gguf import CONVERT, FAMILIES, N_CTX, TEXT, save_hf, tiny_tokenizer

import refllama


def yarn(**change):
    return {"rope_parameters": {**FAMILIES["yarn"][1]["rope_parameters"], **change}}


CASES = (  # (family, config fields changed, what the case shows)
    ("gemma2", {}, "Gemma 2 as released: GELU (llama.cpp's float16 table)"),
    ("gemma3", {}, "Gemma 3: GELU (llama.cpp's float16 table)"),
    ("gemma2", {"query_pre_attn_scalar": 64}, "Gemma 2, query_pre_attn_scalar 64 != head_dim 32"),
    ("smollm3", {"no_rope_layers": [1, 0, 1, 1]}, "SmolLM3, NoPE at layer 1 (not every 4th)"),
    ("yarn", {}, "YaRN, the config's defaults (betas 32/1, truncated)"),
    ("yarn", yarn(beta_fast=16.0, beta_slow=0.5), "YaRN, beta_fast 16, beta_slow 0.5"),
    ("yarn", yarn(truncate=False), "YaRN, truncate false (gpt-oss's)"),
    ("yarn", yarn(attention_factor=1.5), "YaRN, attention_factor 1.5"),
)


def rel(a, b):
    return float(np.abs(a - b).max() / (b.max() - b.min()))


def run(llama_cpp_dir, family, change, tmp):
    """(transformers, llama.cpp, refllama HF, refllama GGUF or an error) logits of the case."""
    hf_dir, gguf = tmp / "hf", tmp / "model-f32.gguf"
    model = save_hf(family, hf_dir, tiny_tokenizer(), **change)
    script = CONVERT.format(src=llama_cpp_dir, model=str(hf_dir), outtype="f32", out=str(gguf))
    subprocess.run([sys.executable, "-c", script], check=True, cwd=llama_cpp_dir, capture_output=True)
    vocab = llama_cpp.Llama(str(gguf), vocab_only=True, verbose=False)
    ids = vocab.tokenize(TEXT.encode(), add_bos=True, special=False)
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits[0].numpy()
    llamacpp = dump_llamacpp.capture(str(gguf), ids, 2, kv_f32=True, n_ctx=N_CTX)[0]["result_output"]
    ours_hf = refllama.load(hf_dir, n_ctx=N_CTX).logits(ids)
    try:
        ours_gguf = refllama.load(gguf, n_ctx=N_CTX).logits(ids)
    except refllama.RefllamaError as e:
        ours_gguf = str(e).split(": ", 1)[-1]
    return theirs, llamacpp, ours_hf, ours_gguf


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama-cpp", required=True, help="vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist")
    args = p.parse_args()
    print("| case | transformers vs llama.cpp | refllama (HF) vs transformers | refllama (GGUF) vs transformers |"
          " refllama (GGUF) vs llama.cpp |")
    print("| --- | --- | --- | --- | --- |")
    for family, change, what in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            hf, cpp, ours_hf, ours_gguf = run(args.llama_cpp, family, change, Path(tmp))
        gguf = ([f"{rel(ours_gguf, hf):.1e}", f"{rel(ours_gguf, cpp):.1e}"] if not isinstance(ours_gguf, str)
                else [f"refused: {ours_gguf}", "-"])
        print(f"| {what} | {rel(cpp, hf):.1e} | {rel(ours_hf, hf):.1e} | {' | '.join(gguf)} |")


if __name__ == "__main__":
    main()
