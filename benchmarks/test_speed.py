"""pytest-benchmark suite (not part of the default test run): `python -m pytest benchmarks/ --benchmark-only`.

Each benchmark has its peer in the same run (numpy vs numba, kernel vs BLAS on float32), so compare
the rows of one table, never absolute times across machines. `tools/bench.py` compares with llama.cpp
and transformers.
"""

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import refllama
from refllama.arch.blocks import pre_norm_forward as forward
from refllama.numerics.quant import QuantMatrix

PROMPT = "The printing press changed how knowledge moved through Europe. " * 12


@pytest.fixture(scope="module", params=["numpy", "numba"])
def loaded(request):
    refllama.set_threads(None, request.param)
    m = refllama.load(backend=request.param, n_ctx=512)
    return m, m.tokenize(PROMPT)[:128]


def test_prefill_128_tokens(benchmark, loaded):
    m, ids = loaded
    benchmark(m._prefill, ids, True)


def test_decode_one_token(benchmark, loaded):
    m, ids = loaded
    m._prefill(ids, True)

    def step():
        forward(m.weights, m.config, m.ops, np.asarray([ids[-1]]), 128, m.cache, True)  # position 128, rewritten
    benchmark(step)


@pytest.mark.parametrize("kind", ["float32 BLAS", "Q4_1 kernel", "Q8_0 kernel"])
def test_matvec_1536x576(benchmark, kind):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 576)).astype(np.float32)
    if kind == "float32 BLAS":
        w = rng.standard_normal((1536, 576)).astype(np.float32)
    else:
        qt = QT.Q4_1 if kind.startswith("Q4_1") else QT.Q8_0
        raw = rng.integers(0, 0x3C, gguf.quant_shape_to_byte_shape((1536, 576), qt), dtype=np.uint8)
        w = QuantMatrix([raw], qt, 576)
    benchmark(lambda: x @ w.T)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "MXFP4", "Q8_0", "Q5_0"])
def test_ggml_one_token_5760x2816(benchmark, qtype):
    """numerics ggml's one-token product (the decode step's) on a matrix of a gpt-oss expert's width that stays in
    L3: the kernels' own speed, not the memory's; its bytes over the time are docs/performance.md's GB/s. Repacked
    where llama.cpp's x86 build repacks the type (Q4_K, MXFP4)."""
    from refllama.formats.ggml_types import QuantizedTensor
    from refllama.numerics.ggml_kernels import GgmlNumbaPlacement

    rng = np.random.default_rng(0)
    qt = QT[qtype]
    raw = rng.integers(0, 0x3C, gguf.quant_shape_to_byte_shape((5760, 2816), qt), dtype=np.uint8)
    w = GgmlNumbaPlacement()(QuantizedTensor(raw, qt, (5760, 2816)))
    x = rng.standard_normal((1, 2816)).astype(np.float32)
    benchmark.extra_info["MB"] = raw.nbytes / 1e6  # GB/s = MB / median (ms)
    benchmark(lambda: x @ w.T)


@pytest.mark.parametrize("T", [1, 2, 6, 16])
@pytest.mark.parametrize("qtype", ["Q4_K", "MXFP4", "Q8_0", "Q5_0"])
def test_ggml_expert_rows_2048x1536(benchmark, qtype, T):
    """An expert's product with the few rows a prefill hands it (llama.cpp's mul_mat_id: the gemv on each row where
    the type is repacked): the rows one at a time up to the type's FEW, a lane tile of 16 past it; the time over T
    against T = 1's says which costs less (docs/performance.md)."""
    from refllama.formats.ggml_types import QuantizedTensor
    from refllama.numerics.ggml_kernels import GgmlNumbaPlacement

    rng = np.random.default_rng(0)
    qt = QT[qtype]
    raw = rng.integers(0, 0x3C, gguf.quant_shape_to_byte_shape((2048, 1536), qt), dtype=np.uint8)
    w = GgmlNumbaPlacement()(QuantizedTensor(raw, qt, (2048, 1536)))
    x = rng.standard_normal((T, 1536)).astype(np.float32)
    benchmark(lambda: w.matmul_id(x) if hasattr(w, "matmul_id") else x @ w.T)
