"""Differential tests against llama.cpp on every vocabulary of its tokenizer suite: texts from the generators of
llama.cpp's test-tokenizer-random.py (fixed seeds) and llama.cpp's ids for them, in both modes, BOS and special
tokens included (tools/make_tokenizer_random.py made them); the end-of-generation sets; streaming detokenization."""

import gzip
import json
from pathlib import Path

import pytest
from test_tokenizer_suite import SKIP, VOCAB, load

DATA = json.loads(gzip.decompress((Path(__file__).parent / "data" / "tokenizer_random_llamacpp.json.gz")
                                  .read_bytes()).decode("utf-8"))
VOCABS = sorted(DATA["vocabs"])
MODES = {"00": "no BOS, no special parsing", "11": "BOS, special parsing", "01": "no BOS, special parsing",
         "10": "BOS, no special parsing"}


@pytest.fixture(scope="module", params=VOCABS)
def vocab(request):
    """(name, tokenizer, stored llama.cpp data); a suite vocabulary skips without the cache (a real model's not)."""
    name = request.param
    if name not in ("smollm2", "gemma3") and not (VOCAB / "VERSION").exists():
        pytest.skip(SKIP)
    if name == "gemma3":
        request.getfixturevalue("gemma3_path")  # skips, saying how to install it, when Gemma 3's package is absent
    return name, load(name), DATA["vocabs"][name]


def test_every_vocabulary_and_generator_is_stored():
    assert len(VOCABS) == 17 + 2  # the suite's BPE and SentencePiece vocabularies, SmolLM2's and Gemma 3's
    for v in DATA["vocabs"].values():
        kinds = {**DATA["shared"], **v["texts"]}
        assert set(v["ids"]) == set(kinds) and all(len(texts) >= 6 for texts in kinds.values())


def test_ids_equal_llamacpps(vocab):
    name, tok, ref = vocab
    texts = {**DATA["shared"], **ref["texts"]}
    wrong, n = [], 0
    for kind, by_mode in ref["ids"].items():
        for mode, expected in by_mode.items():
            for text, ids in zip(texts[kind], expected, strict=True):
                n += 1
                got = tok.encode(text, add_special=mode[0] == "1", parse_special=mode[1] == "1")
                if got != ids:
                    at = next((i for i, (a, b) in enumerate(zip(got, ids, strict=False)) if a != b),
                              min(len(got), len(ids)))
                    wrong.append(f"{kind} ({MODES[mode]}) {text[:40]!r}: first difference at {at}, "
                                 f"llama.cpp {ids[at:at + 4]}, refllama {got[at:at + 4]}")
    assert n > 100
    assert not wrong, f"{name}: {len(wrong)} of {n} texts differ; " + "; ".join(wrong[:3])


def test_end_of_generation_set_is_llamacpps(vocab):
    name, tok, ref = vocab
    assert sorted(tok.eog_ids) == ref["eog"]


def test_streaming_never_splits_a_character(vocab):
    """Ids fed one by one give the text decode gives for all of them at once: no character is cut in two (byte
    tokens of SentencePiece, byte-level BPE pieces of a multi-byte character)."""
    name, tok, ref = vocab
    for text in DATA["shared"]["random_unicodes"][:3] + DATA["shared"]["custom"]:
        ids = tok.encode(text, add_special=False)
        stream = tok.stream()
        assert "".join(stream.step(i) for i in ids) == tok.decode(ids)
