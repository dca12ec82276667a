"""tools/make_synthetic_model.py: a cut-down model with a real model's widths and vocabulary (Phi-3-mini's, one
layer) loads and runs on numpy and numba, its Q4_K_M mix as llama-quantize lays it out."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

import refllama
from refllama.formats.ggml_types import GGMLType as QT
from refllama.formats.gguf_loader import GGUFFile

TOOL = Path(__file__).parent.parent / "tools" / "make_synthetic_model.py"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("make_synthetic_model", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not (module.VOCABS / "ggml-vocab-phi-3.gguf").exists():
        pytest.skip("needs llama.cpp's vocabulary files: python tools/fetch_llamacpp_vocabs.py")
    return module


@pytest.fixture(scope="module")
def phi3(tool, tmp_path_factory):
    return tool.write("phi-3-mini", "q4_k_m", tmp_path_factory.mktemp("synthetic"), n_layer=1)


@pytest.mark.slow  # writes a synthetic model
def test_a_cut_down_synthetic_model_says_so_and_has_the_q4_k_m_mix(phi3):
    g = GGUFFile(phi3)
    assert g.string("general.name").startswith("synthetic phi-3-mini")
    types = {name: t.tensor_type for name, t in g.tensors.items()}
    assert types["output.weight"] == QT.Q6_K and types["blk.0.ffn_down.weight"] == QT.Q6_K  # llama-quantize's
    assert types["blk.0.attn_qkv.weight"] == QT.Q4_K and types["blk.0.attn_norm.weight"] == QT.F32
    assert g.tensors["token_embd.weight"].shape[1] == 32064  # Phi-3's vocabulary, its width 3072


@pytest.mark.slow  # Numba's Q4_K and Q6_K kernels compiled (a cold cache: the fast tier compiles none)
def test_a_cut_down_synthetic_model_runs_finite_and_alike_on_numpy_and_numba(phi3):
    ids = [1, 450, 3186, 310, 278]
    a = refllama.load(phi3, backend="numpy", n_ctx=64).logits(ids)
    b = refllama.load(phi3, backend="numba", n_ctx=64, threads=1).logits(ids)
    assert np.isfinite(a).all() and np.ptp(a) > 0
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-4 * np.ptp(a))


def test_llama_cpp_loads_and_runs_a_synthetic_model(phi3):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is a reference tool: pip install "
                                    "../shared/wheels/llama_cpp_python-*.whl")
    llm = llama_cpp.Llama(str(phi3), n_ctx=64, verbose=False)
    llm.eval([1, 450, 3186])
    assert np.isfinite(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))).all()
