"""Golden tests against the two references, run on the same GGUF (data: tools/make_golden.py, see golden*.json), for
the default model (SmolLM2, 40 steps) and Gemma 3 270M (32 steps; skipped with the reason when it is not installed).

transformers runs float32 on weights it dequantized itself, as refllama's numpy backend does: logits must
agree to 1e-3 of the logit range and greedy tokens must be identical. llama.cpp quantizes activations to
8 bits inside its quantized matmuls and keeps the KV cache in f16, so its own greedy path is checked by teacher
forcing: refllama's top-1 along it must agree on >= 95% of steps, and every disagreement must be a near-tie.
"""

import json
from pathlib import Path

import numpy as np
import pytest
from tiers import first_fast

from refllama.check.dump import file_sha256

DATA = Path(__file__).parent / "data"
MODELS = {"smollm2": ("model", "golden", 40), "gemma3": ("gemma3", "golden_gemma3", 32)}  # fixture, data, steps
PROMPTS = ["plain", "chat", "unicode"]
LOGIT_TOL = 1e-3  # of the reference's logit range (max - min) at each position
NEAR_TIE = 0.25  # a llama.cpp disagreement must be within this many logits of refllama's best token


@pytest.fixture(scope="module", params=list(MODELS))
def case(request):
    """(model, golden json, golden arrays, greedy steps) of one model."""
    fixture, name, steps = MODELS[request.param]
    return (request.getfixturevalue(fixture), json.loads((DATA / f"{name}.json").read_text(encoding="utf-8")),
            np.load(DATA / f"{name}.npz"), steps)


def test_golden_data_is_for_this_model(case):
    model, meta, _, _ = case
    assert meta["_provenance"]["model_sha256"] == file_sha256(model.path)


@pytest.mark.parametrize("name", PROMPTS)
def test_prompt_tokenizes_as_llamacpp_did(case, name):
    model, meta, _, _ = case
    assert model.tokenize(meta[name]["text"], parse_special=meta[name]["parse_special"]) == meta[name]["ids"]


@pytest.mark.parametrize("name", first_fast(PROMPTS))  # the other prompts: the slow tier
def test_greedy_tokens_equal_transformers(case, name):
    model, meta, _, steps = case
    assert len(meta[name]["hf_greedy"]) == steps
    assert list(model.generate(meta[name]["ids"], max_tokens=steps, temperature=0)) == meta[name]["hf_greedy"]


@pytest.mark.parametrize("name", PROMPTS)
def test_logits_match_transformers_at_every_position(case, name):
    model, meta, z, _ = case
    logits = model.logits(meta[name]["ids"] + meta[name]["hf_greedy"][:-1])
    scale = z[f"{name}/hf_max"] - z[f"{name}/hf_min"]  # [T]
    err_cols = np.abs(logits[:, z["columns"]] - z[f"{name}/hf_columns"]).max(axis=1)
    top = np.take_along_axis(logits, z[f"{name}/hf_top_ids"], axis=1)
    err_top = np.abs(top - z[f"{name}/hf_top_logits"]).max(axis=1)
    worst = np.maximum(err_cols, err_top) / scale
    assert worst.max() < LOGIT_TOL, f"position {worst.argmax()}: error {worst.max():.2e} of the logit range"
    np.testing.assert_allclose(logits.max(axis=1), z[f"{name}/hf_max"], atol=LOGIT_TOL * scale.min())
    np.testing.assert_allclose(logits.min(axis=1), z[f"{name}/hf_min"], atol=LOGIT_TOL * scale.min())


def test_top1_agrees_with_llamacpp_along_its_greedy_path(case):
    model, meta, _, _ = case
    agree, steps, far = 0, 0, []
    for name in PROMPTS:
        ids, path = meta[name]["ids"], meta[name]["llamacpp_greedy"]
        logits = model.logits(ids + path[:-1])[len(ids) - 1:]  # the rows that predicted each path token
        best = logits.argmax(axis=1)
        agree += int((best == np.array(path)).sum())
        steps += len(path)
        for i in np.flatnonzero(best != np.array(path)):
            gap = logits[i, best[i]] - logits[i, path[i]]
            if gap > NEAR_TIE:
                far.append((name, int(i), float(gap)))
    assert agree / steps >= 0.95, f"top-1 agreement {agree}/{steps}"
    assert not far, f"disagreements that are not near-ties: {far}"
