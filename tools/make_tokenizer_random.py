"""Write tests/data/tokenizer_random_llamacpp.json.gz: llama.cpp's ids for generated texts on every vocabulary of its
tokenizer suite and of the two real models (SmolLM2, Gemma 3 270M), in the modes (no BOS, no special parsing),
(BOS, special parsing) and, for texts made of special tokens, the other two; and each vocabulary's
end-of-generation set (llama_vocab_is_eog).

The generators are those of llama.cpp's test-tokenizer-random.py, ported: its hand-written texts and edge
cases, random words of ASCII/Latin characters, random Unicode, random words of the vocabulary, random runs of its
special and added tokens, and those tokens with whitespace around them. Seeds 0 to SEEDS-1.

Needs llama-cpp-python (a reference tool, not a refllama dependency) and the suite in its cache:
    pip install ../shared/wheels/llama_cpp_python-*.whl
    python tools/fetch_llamacpp_vocabs.py
    python tools/make_tokenizer_random.py
"""

import gzip
import json
import random
import unicodedata
from pathlib import Path

import llama_cpp
from fetch_llamacpp_vocabs import VERSION, cache_dir

DEST = Path(__file__).resolve().parent.parent / "tests" / "data" / "tokenizer_random_llamacpp.json.gz"
VOCABS = ["aquila", "baichuan", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2",
          "gpt-neox", "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder"]
REAL = ["smollm2", "gemma3"]  # the default model and Gemma 3 270M (refllama.api finds both)
SEEDS = 6
WHITESPACES = list(" " * 20 + "\n" * 5 + "\r\n" * 5 + "\t" * 5)

CUSTOM = ["", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\t\n", "Hello world", " Hello world", "Hello World",
          " Hello World", " Hello World!", "Hello, world!", " Hello, world!", " this is 🦙.cpp", "w048 7tuijk dsdfhu",
          "нещо на Български", "កាន់តែពិសេសអាចខលចេញ",
          "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ (only emoji that has its own token)", "Hello", " Hello",
          "  Hello", "   Hello", "    Hello", "    Hello\n    Hello", " (", "\n =", "' era",
          "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～", "3", "33", "333", "3333", "33333", "333333",
          "3333333", "33333333", "333333333"]
EDGE = ["\x1f-a", "¼-a", "½-a", "¾-a", "a 〇b", "Ⅵ-a", "\ufeff//", "Cửa Việt", "<s>a", "<unk><|endoftext|><s>",
        "a\na", '"`', " \u2e4e", "\n\x0b  ", "a\xa0\xa0\x00b", "one <mask>", "a </s> b", "a <mask> b", "\xa0aC",
        "\u2029 \ua3e4", "a ?", "å", "\U000ac517", "\U000522f4", "<s><s><unk><s>a<s>b<s>c<unk>d<unk></s>",
        "<s> <s> <unk><s>a<s>b<s>c<unk>d<unk></s>", "a </s> b", "<|endoftext|> x", "x <|im_end|>\n y",
        "I'M don'T 'S 'll", "1234567 ١٢٣ ½", "\r\n\r\n \r \n", "\u3000 \u2028x\u2029", "\U0001f600\U0001f3fb"]


def random_chars(seed):
    chars = sorted(set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyzÁÉÍÓÚÀÈÌÒÙÂÊÎÔÛÄËÏÖÜáéíóúàèìòùâêîôûäëïöü"
                       ".-,*/-+ª!\"·$%&/()=?¿[]{}<>\\|@#~½¬~;:_"))
    rand = random.Random(seed)
    return "".join("".join(rand.choices(chars, k=rand.randint(1, 7))) + rand.choice(WHITESPACES) for _ in range(400))


UNICODES = [chr(c) for c in range(0x30000) if unicodedata.category(chr(c)) not in ("Cn", "Cs", "Co")]


def random_unicodes(seed):
    rand = random.Random(seed)
    return "".join("".join(rand.choices(UNICODES, k=rand.randint(1, 7))) + rand.choice(WHITESPACES)
                   for _ in range(200))


def random_vocab_words(words, seed):
    rand = random.Random(seed)
    return "".join("".join(rand.choices(words, k=rand.randint(1, 3))) + rand.choice("     \n\r\t")
                   for _ in range(rand.randint(300, 400)))


def random_added_tokens(specials, seed):
    rand = random.Random(seed)
    pool = sorted(set(specials + [" ", "\n", "\t", "-", "!", "one", "1", "<s>", "</s>"]))
    return "".join(rand.choices(pool, k=500))


def added_lr_strip(specials, seed):
    """Each of a sample of special tokens with whitespace on either side, alone and between letters."""
    rand = random.Random(seed)
    spaces = ["", " ", "  ", "\n", "\r\n", "\n\n", "\t", "\t\t"]
    out = []
    for t in rand.sample(specials, min(12, len(specials))):
        left, right = rand.choice(spaces), rand.choice(spaces)
        out += [left + t + right, "a" + left + t + right, left + t + right + "z", "a" + left + t + right + "z"]
    return out


def real_model(name):
    from refllama.api import default_model_path, gemma3_path

    return default_model_path() if name == "smollm2" else gemma3_path()


def main():
    vocab_dir = cache_dir()
    out = {"producer": f"llama-cpp-python {llama_cpp.__version__}, Llama(vocab_only=True).tokenize(text, "
                       "add_bos=add_special, special=parse_special), on the vocabularies of its sdist "
                       f"(tools/fetch_llamacpp_vocabs.py, {VERSION})",
           "shared": {"custom": CUSTOM, "edge": EDGE, "random_chars": [random_chars(s) for s in range(SEEDS)],
                      "random_unicodes": [random_unicodes(s) for s in range(SEEDS)]},
           "vocabs": {}}
    for name in VOCABS + REAL:
        path = vocab_dir / f"ggml-vocab-{name}.gguf" if name in VOCABS else real_model(name)
        llm = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        n = llama_cpp.llama_vocab_n_tokens(vocab)
        texts = [llm.detokenize([i], special=True).decode("utf-8", "replace") for i in range(n)]
        attrs = [llama_cpp.llama_vocab_get_attr(vocab, i) for i in range(n)]
        specials = sorted({texts[i] for i in range(n) if attrs[i] & (1 | 8 | 16)} - {""})  # unknown/control/user
        words = [t.strip() for t in texts if t.strip()]
        own = {"random_vocab_words": [random_vocab_words(words, s) for s in range(SEEDS)],
               "random_added_tokens": [random_added_tokens(specials, s) for s in range(SEEDS)],
               "added_lr_strip": [t for s in range(SEEDS) for t in added_lr_strip(specials, s)]}
        ids = {}
        for kind, group in [*out["shared"].items(), *own.items()]:
            modes = [(False, False), (True, True)] + ([(False, True), (True, False)] if "added" in kind else [])
            ids[kind] = {f"{int(b)}{int(p)}": [llm.tokenize(t.encode(), add_bos=b, special=p) for t in group]
                         for b, p in modes}
        eog = [i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)]
        out["vocabs"][name] = {"texts": own, "ids": ids, "eog": eog}
        print(name, n, "tokens,", len(specials), "special texts,", "eog", eog[:8])
    with gzip.open(DEST, "wt", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)
    print(DEST, DEST.stat().st_size // 1024, "KB")


if __name__ == "__main__":
    main()
