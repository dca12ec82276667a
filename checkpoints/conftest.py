"""Parametrization of the checkpoint suite: reference x prompt x model (`case`), stored layer, mode.

Models: "gguf-numpy", "gguf-numba" (quantized weights, Numba kernels) and "gguf-cupy" (skipped with a reason
when CuPy or a GPU is missing) load SmolLM2's GGUF file; "hf-numpy" is the same model exported by
`refllama.convert` to an HF directory (safetensors, half-split q/k), loaded back and checked against the
transformers references.
"""

import harness
import pytest

import refllama
from refllama.convert import convert
from refllama.xp import BACKENDS

CASES = ([(r, p, f"gguf-{b}") for b in BACKENDS for r, p in harness.REFS]
         + [(r, p, "hf-numpy") for r, p in harness.REFS if r == "hf"])


def pytest_generate_tests(metafunc):
    if "case_id" in metafunc.fixturenames:
        backends = metafunc.config.getoption("backend") or BACKENDS  # pytest checkpoints/ --backend numba
        cases = [c for c in CASES if c[2].split("-")[1] in backends]
        metafunc.parametrize("case_id", cases, ids=[f"{harness.KINDS[r]}-{p}-{m}" for r, p, m in cases])
    if "layer" in metafunc.fixturenames:
        metafunc.parametrize("layer", harness.stored_layers(), ids=lambda n: f"layer{n}")
    if "mode" in metafunc.fixturenames:
        metafunc.parametrize("mode", harness.MODES)


@pytest.fixture(scope="session")
def exported_model(model, tmp_path_factory):
    """SmolLM2 exported to an HF directory (float32) and loaded from there."""
    return refllama.load(convert(model.path, tmp_path_factory.mktemp("export") / "smollm2-hf"))


@pytest.fixture(scope="session")
def numba_model(model):
    return refllama.load(model.path, backend="numba")


@pytest.fixture(scope="session")
def cupy_model(model):
    try:
        return refllama.load(model.path, backend="cupy")
    except refllama.RefllamaError as e:
        pytest.skip(f"cupy backend unavailable here: {e}")


@pytest.fixture
def case(request, model, case_id):
    ref, prompt, which = case_id
    models = {"gguf-numpy": lambda: model, "gguf-numba": lambda: request.getfixturevalue("numba_model"),
              "gguf-cupy": lambda: request.getfixturevalue("cupy_model"),
              "hf-numpy": lambda: request.getfixturevalue("exported_model")}
    return harness.Case(models[which](), ref, prompt)
