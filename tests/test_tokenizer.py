"""Tokenizer: ids equal llama.cpp's for a table of tricky strings; streaming never splits a character."""

import hashlib
import json
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"

TABLE = json.loads((DATA / "tokenizer_llamacpp.json").read_text(encoding="utf-8"))


def test_table_is_made_from_the_default_model(model):
    assert TABLE["model_sha256"] == hashlib.sha256(Path(model.path).read_bytes()).hexdigest()
    assert len({c["text"] for c in TABLE["cases"]}) >= 30


def case_id(c):
    return f"{c['text'][:24]!r}-bos{int(c['add_special'])}-special{int(c['parse_special'])}"


@pytest.mark.parametrize("case", TABLE["cases"],
                         ids=case_id)
def test_ids_equal_llamacpp(model, case):
    got = model.tokenize(case["text"], add_special=case["add_special"], parse_special=case["parse_special"])
    assert got == case["ids"]


def test_end_of_generation_tokens_are_llamacpps(model):
    """llama_vocab_is_eog over the vocabulary: SmolLM2's holds <reponame>, which llama.cpp takes for a FIM token."""
    assert sorted(model.tokenizer.eog_ids) == TABLE["eog"] == [0, 2, 4]


def test_special_tokens_only_parsed_when_asked(model):
    assert model.tokenize("<|im_start|>", parse_special=True) == [1]
    assert len(model.tokenize("<|im_start|>", parse_special=False)) > 1


def test_bos_follows_metadata(model):
    assert model.tokenizer.add_bos is False  # SmolLM2: tokenizer.ggml.add_bos_token = false
    assert model.tokenize("") == []


@pytest.mark.parametrize("text", ["Hello, world!", "café naïve 日本語 🤖👨‍👩‍👧", "  tabs\tand\nnewlines\n\n", "x" * 50])
def test_detokenize_round_trips(model, text):
    assert model.detokenize(model.tokenize(text)) == text


def test_streaming_never_emits_half_a_character(model):
    text = "emoji 🤖🚀 and 👨‍👩‍👧, 日本語, café — ok"
    ids = model.tokenize(text)
    stream = model.tokenizer.stream()
    pieces = [stream.step(i) for i in ids]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    # some single tokens here are partial UTF-8 sequences: the stream holds them back, then emits whole characters
    assert any(p == "" for p in pieces)


def test_out_of_range_ids_are_refused(model):
    import refllama

    with pytest.raises(refllama.RefllamaError, match="token id 49152"):
        model.detokenize([1, 49152])


SPM = json.loads((DATA / "tokenizer_spm_llamacpp.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def spm_tokenizer(tmp_path_factory):
    """refllama's tokenizer for the tiny SentencePiece vocabulary that tools/make_spm_tokenizer_table.py made."""
    from gguf import GGUFValueType as VT
    from tiny_gguf import tiny_metadata, tiny_tensors, write_gguf

    from refllama.formats.gguf_loader import GGUFFile
    from refllama.formats.tokenizer import from_gguf

    meta = {k: v for k, v in tiny_metadata().items() if not k.startswith("tokenizer.")}
    meta.update({
        "tokenizer.ggml.model": ("llama", VT.STRING), "tokenizer.ggml.tokens": (SPM["tokens"], VT.ARRAY),
        "tokenizer.ggml.scores": (SPM["scores"], VT.ARRAY), "tokenizer.ggml.token_type": (SPM["token_type"], VT.ARRAY),
        "tokenizer.ggml.bos_token_id": (1, VT.UINT32), "tokenizer.ggml.eos_token_id": (2, VT.UINT32),
        "tokenizer.ggml.unknown_token_id": (0, VT.UINT32),
    })
    path = write_gguf(tmp_path_factory.mktemp("spm") / "spm.gguf", meta, tiny_tensors())
    return from_gguf(GGUFFile(path))


@pytest.mark.parametrize("case", SPM["cases"],
                         ids=case_id)
def test_sentencepiece_ids_equal_llamacpp(spm_tokenizer, case):
    assert spm_tokenizer.encode(case["text"], case["add_special"], case["parse_special"]) == case["ids"]


def test_sentencepiece_decodes_back(spm_tokenizer):
    text = "hello world, café 日本"
    assert spm_tokenizer.decode(spm_tokenizer.encode(text, add_special=False)) == text


def test_sentencepiece_without_byte_tokens_names_the_byte(tmp_path):
    """A character no token spells falls back to byte tokens; a vocabulary without them is refused for that byte
    (llama.cpp's byte_to_token throws there too), not tokenized into something else."""
    from gguf import GGUFValueType as VT
    from tiny_gguf import tiny_metadata, tiny_tensors, write_gguf

    import refllama
    from refllama.formats.gguf_loader import GGUFFile
    from refllama.formats.tokenizer import from_gguf

    meta = {k: v for k, v in tiny_metadata().items() if not k.startswith("tokenizer.")}
    tokens = ["<unk>", "<s>", "</s>", "▁", "a", "▁a"]
    meta.update({"tokenizer.ggml.model": ("llama", VT.STRING), "tokenizer.ggml.tokens": (tokens, VT.ARRAY),
                 "tokenizer.ggml.scores": ([0.0, 0.0, 0.0, -1.0, -2.0, -0.5], VT.ARRAY),
                 "tokenizer.ggml.token_type": ([2, 3, 3, 1, 1, 1], VT.ARRAY)})
    tok = from_gguf(GGUFFile(write_gguf(tmp_path / "spm.gguf", meta, tiny_tensors())))
    assert tok.encode("a a", add_special=False) == [5, 5]
    with pytest.raises(refllama.RefllamaError, match="no token for byte 0xC3"):
        tok.encode("é", add_special=False)


def test_a_lone_surrogate_is_refused_with_its_position(model):
    import refllama

    with pytest.raises(refllama.RefllamaError, match="lone surrogate at character 2"):
        model.tokenize("ab\ud800c")
