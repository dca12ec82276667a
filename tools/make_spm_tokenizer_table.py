"""Write tests/data/tokenizer_spm_llamacpp.json: llama.cpp's ids for a tiny SentencePiece ("llama") vocabulary.

SmolLM2 uses byte-level BPE, so this checks refllama's SentencePiece path on a small vocabulary made here
(pieces with scores, byte-fallback tokens, <unk>/<s>/</s>), written to a GGUF that llama.cpp tokenizes.
The JSON holds the vocabulary too, so the test rebuilds the same file.

    python tools/make_spm_tokenizer_table.py     # needs llama-cpp-python, see README
"""

import json
import tempfile
from pathlib import Path

import gguf
import llama_cpp
import numpy as np

PIECES = ["▁", "e", "t", "a", "o", "i", "n", "s", "h", "r", "d", "l", "u", "c", "m", "w", "f", "g", "y", "p",
          "b", "k", "v", ",", ".", "!", "T", "E", "H", "▁t", "he", "▁the", "in", "ing", "▁a", "an", "nd", "▁and",
          "er", "▁w", "or", "ou", "▁o", "en", "is", "▁s", "it", "at", "on", "es", "▁c", "ed", "▁th", "▁is", "▁in",
          "▁of", "▁to", "ll", "▁he", "▁hel", "llo", "▁hello", "▁wor", "▁world", "é", "▁caf", "▁café", "▁▁", "▁▁▁▁"]
STRINGS = ["hello world", "the cat sat on the mat", " leading space", "double  space", "four    spaces",
           "café", "日本", "emoji 🤖!", "tab\there", "new\nline", "", "The End.", "<s>text</s>", "HELLO, World!",
           "ing ing thing", "zzz qqq"]


def vocabulary():
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + PIECES
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(PIECES))]
    types = [2, 3, 3] + [6] * 256 + [1] * len(PIECES)
    return tokens, scores, types


def write(path, tokens, scores, types):
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in {"block_count": 1, "context_length": 64, "embedding_length": 32, "feed_forward_length": 32,
                       "attention.head_count": 1, "attention.head_count_kv": 1}.items():
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_tensor("token_embd.weight", np.zeros((len(tokens), 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    tokens, scores, types = vocabulary()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "spm.gguf"
        write(path, tokens, scores, types)
        llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        cases = [{"text": s, "add_special": a, "parse_special": p,
                  "ids": llm.tokenize(s.encode("utf-8"), add_bos=a, special=p)}
                 for s in STRINGS for a in (True, False) for p in (False, True)]
    out = {"producer": f"llama-cpp-python {llama_cpp.__version__}, Llama(vocab_only=True).tokenize",
           "tokens": tokens, "scores": scores, "token_type": types, "cases": cases}
    dest = Path(__file__).resolve().parent.parent / "tests" / "data" / "tokenizer_spm_llamacpp.json"
    dest.write_text(json.dumps(out, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {len(cases)} cases to {dest}")


if __name__ == "__main__":
    main()
