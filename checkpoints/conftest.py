"""Parametrization of the checkpoint suite: reference x model (`case_id`), each reference's stored layers, mode.

Models for SmolLM2's references: "gguf-numpy", "gguf-numba" (quantized weights, Numba kernels) and "gguf-cupy"
(skipped with a reason when CuPy or a GPU is missing) load its GGUF file; "hf-numpy" is the same model exported by
`refllama.convert` to an HF directory (safetensors, half-split q/k), loaded back and checked against the
transformers references; "ggml-numpy" and "ggml-numba" load the GGUF in numerics "ggml" and are checked against
the llama.cpp references in the table's ggml column, on the CPU path of the build that made them ("ggml-numpy" on
the short prompt only: the NumPy emulation of the longer ones takes minutes, "ggml-numba" checks them, and
tests/test_ggml_numerics.py holds the two to the bit). Each tiny
family's references check its F32 GGUF on numpy, "f32-numpy", and on cupy, "f32-cupy" (skipped with a reason where
CuPy or a GPU is missing). A test module that sets `NEEDS = "stage"` runs only on the models whose blocks have that
stage; one that sets `DECODE = True`, only on the references that hold decode steps; `FAST_MODELS`, the models
its fast tier runs (numpy's, unless it names fewer).
"""

import harness
import pytest
from tiers import param

import refllama
from refllama.convert import convert
from refllama.xp import BACKENDS

CASES = ([(i, f"gguf-{b}") for b in BACKENDS for i, r in enumerate(harness.REFS) if r.model == "smollm2"]
         + [(i, "hf-numpy") for i, r in enumerate(harness.REFS) if r.model == "smollm2" and r.source == "hf"]
         + [(i, f"ggml-{b}") for b in ("numpy", "numba") for i, r in enumerate(harness.REFS)
            if r.model == "smollm2" and r.source == "llamacpp" and (b == "numba" or r.prompt == "short")]
         + [(i, f"f32-{b}") for b in ("numpy", "cupy") for i, r in enumerate(harness.REFS) if r.model != "smollm2"])


def case_name(case_id):
    r = harness.REFS[case_id[0]]
    model = "" if r.model == "smollm2" else f"{r.model}-"
    return f"{r.source}-{model}{r.prompt}-{case_id[1]}"


FAST_PROMPT = {"smollm2": "short", "family": "text"}  # each reference's prompt in the fast tier


def fast(module, case_id, layer=None):
    """Whether a case is in the fast tier: one prompt a reference, one backend a model kind (numpy; a module's
    FAST_MODELS, where it names them), and of the layers the first and the last; the rest is `slow`
    (tests/README.md)."""
    r, which = harness.REFS[case_id[0]], case_id[1]
    layers = harness.stored_layers(r)
    return (r.prompt == FAST_PROMPT["smollm2" if r.model == "smollm2" else "family"]
            and which in getattr(module, "FAST_MODELS", (which,)) and which.endswith("-numpy")
            and (layer is None or layer in (layers[0], layers[-1])))


def pytest_generate_tests(metafunc):
    names = metafunc.fixturenames
    if "case_id" in names:
        backends = metafunc.config.getoption("backend") or BACKENDS  # pytest checkpoints/ --backend numba
        cases = [c for c in CASES if c[1].split("-")[1] in backends]
        needs = getattr(metafunc.module, "NEEDS", None)
        if needs:
            cases = [c for c in cases if any(e["stage"] == needs for e in harness.reference(
                harness.REFS[c[0]].path).entries.values())]
        if getattr(metafunc.module, "DECODE", False):  # a module for the references with decode steps
            cases = [c for c in cases if harness.reference(harness.REFS[c[0]].path).decode_ids]
        if "layer" in names:
            metafunc.parametrize("case_id, layer", [
                param(c, n, id=f"{case_name(c)}-layer{n}", fast=fast(metafunc.module, c, n))
                for c in cases for n in harness.stored_layers(harness.REFS[c[0]])])
        else:
            metafunc.parametrize("case_id", [param(c, id=case_name(c), fast=fast(metafunc.module, c)) for c in cases])
    if "mode" in names:
        metafunc.parametrize("mode", harness.MODES)


@pytest.fixture(scope="session")
def exported_model(model, tmp_path_factory):
    """SmolLM2 exported to an HF directory (float32) and loaded from there."""
    return refllama.load(convert(model.path, tmp_path_factory.mktemp("export") / "smollm2-hf"))


@pytest.fixture(scope="session")
def numba_model(model):
    return refllama.load(model.path, backend="numba")


@pytest.fixture(scope="session")
def ggml_model(model):
    return refllama.load(model.path, numerics="ggml", cpu_path=harness.llamacpp_path())


@pytest.fixture(scope="session")
def ggml_numba_model(model):
    return refllama.load(model.path, backend="numba", numerics="ggml", cpu_path=harness.llamacpp_path())


@pytest.fixture(scope="session")
def cupy_model(model):
    try:
        return refllama.load(model.path, backend="cupy")
    except refllama.RefllamaError as e:
        pytest.skip(f"cupy backend unavailable here: {e}")


@pytest.fixture
def case(request, case_id):
    i, which = case_id
    ref = harness.REFS[i]
    if ref.model != "smollm2":
        backend = which.split("-")[1]
        try:
            return harness.Case(harness.family_model(ref.model, backend), ref)
        except refllama.RefllamaError as e:
            if backend != "cupy":
                raise
            pytest.skip(f"{which} unavailable here: {e}")
    models = {"gguf-numpy": lambda: request.getfixturevalue("model"),
              "gguf-numba": lambda: request.getfixturevalue("numba_model"),
              "gguf-cupy": lambda: request.getfixturevalue("cupy_model"),
              "hf-numpy": lambda: request.getfixturevalue("exported_model"),
              "ggml-numpy": lambda: request.getfixturevalue("ggml_model"),
              "ggml-numba": lambda: request.getfixturevalue("ggml_numba_model")}
    return harness.Case(models[which](), ref)
