"""llama.cpp's own tokenizer suite (its test-tokenizer-0.cpp): vocabulary-only GGUFs with inputs and the ids
llama.cpp gives them (no BOS, no special-token parsing). `tools/fetch_llamacpp_vocabs.py` puts the files in a cache
(.ci/run does); without it these tests skip, saying so."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
from fetch_llamacpp_vocabs import VERSION, cache_dir  # noqa: E402

VOCAB = cache_dir()
SUITE = ["command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe", "llama-spm",
         "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder"]  # every BPE / SentencePiece vocabulary with cases
UNSUPPORTED = {"bert-bge": "bert", "nomic-bert-moe": "t5"}  # WPM and UGM: embedding models' tokenizers
SKIP = f"no llama.cpp {VERSION} vocabularies in {VOCAB}: run tools/fetch_llamacpp_vocabs.py"
needs_cache = pytest.mark.skipif(not (VOCAB / "VERSION").exists(), reason=SKIP)


def load(name):
    """The tokenizer of a suite vocabulary, or of a real model: "smollm2" (the default model), "gemma3"."""
    from refllama.api import default_model_path, gemma3_path
    from refllama.formats.gguf_loader import GGUFFile
    from refllama.formats.tokenizer import from_gguf

    real = {"smollm2": default_model_path, "gemma3": gemma3_path}
    return from_gguf(GGUFFile(real[name]() if name in real else VOCAB / f"ggml-vocab-{name}.gguf"))


def cases(name):
    """(text, ids) pairs, read as test-tokenizer-0.cpp reads them."""
    raw = (VOCAB / f"ggml-vocab-{name}.gguf.inp").read_bytes().decode("utf-8")
    out = (VOCAB / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").splitlines()  # a line a text
    texts, sep, pos = [], "\n__ggml_vocab_test__\n", 0
    while pos < len(raw):
        nxt = raw.find(sep, pos)
        texts.append(raw[pos:] if nxt < 0 else raw[pos:nxt])
        pos = len(raw) if nxt < 0 else nxt + len(sep)
    return list(zip(texts, ([int(t) for t in line.split()] for line in out), strict=True))


@needs_cache
@pytest.mark.parametrize("name", SUITE)
def test_suite_vocabulary_gives_llamacpps_ids(name):
    tok, pairs = load(name), cases(name)
    assert len(pairs) >= 20
    wrong = [(text, ids, got) for text, ids in pairs if (got := tok.encode(text, add_special=False)) != ids]
    assert not wrong, f"{len(wrong)} of {len(pairs)} differ; first: {wrong[0]}"


@needs_cache
def test_suite_is_complete():
    """Every vocabulary with test files is in SUITE or UNSUPPORTED: a new one in a new sdist is not missed."""
    have = {p.name[len("ggml-vocab-"):-len(".gguf.inp")] for p in VOCAB.glob("ggml-vocab-*.gguf.inp")}
    assert have == set(SUITE) | {"bert-bge"}


@needs_cache
@pytest.mark.parametrize("name", ["aquila", "baichuan", "gpt-neox"])
def test_vocabularies_without_cases_load(name):
    """No test files: loaded as llama.cpp loads them (no `pre`: its default pre-tokenizer), and they round-trip."""
    tok = load(name)
    text = "Hello world, 123 ümlaut\n\t  end"
    assert tok.decode(tok.encode(text, add_special=False)) == text


@needs_cache
@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_embedding_vocabularies_are_refused_by_name(name):
    import refllama

    with pytest.raises(refllama.RefllamaError, match=f"unsupported tokenizer.ggml.model '{UNSUPPORTED[name]}'"):
        load(name)
