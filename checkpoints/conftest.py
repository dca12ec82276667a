"""Parametrization of the checkpoint suite: reference x prompt x model path (`case`), stored layer, mode.

Model paths: "gguf" is SmolLM2's GGUF file; "hf" is the same model exported by `refllama.convert` to an HF
directory (safetensors, half-split q/k) and loaded back, checked against the transformers references.
"""

import harness
import pytest

import refllama
from refllama.convert import convert

CASES = [(r, p, "gguf") for r, p in harness.REFS] + [(r, p, "hf") for r, p in harness.REFS if r == "hf"]


def pytest_generate_tests(metafunc):
    if "case_id" in metafunc.fixturenames:
        metafunc.parametrize("case_id", CASES, ids=[f"{harness.KINDS[r]}-{p}-{m}" for r, p, m in CASES])
    if "layer" in metafunc.fixturenames:
        metafunc.parametrize("layer", harness.stored_layers(), ids=lambda n: f"layer{n}")
    if "mode" in metafunc.fixturenames:
        metafunc.parametrize("mode", harness.MODES)


@pytest.fixture(scope="session")
def exported_model(model, tmp_path_factory):
    """SmolLM2 exported to an HF directory (float32) and loaded from there."""
    return refllama.load(convert(model.path, tmp_path_factory.mktemp("export") / "smollm2-hf"))


@pytest.fixture
def case(request, model, case_id):
    ref, prompt, path = case_id
    return harness.Case(model if path == "gguf" else request.getfixturevalue("exported_model"), ref, prompt)
