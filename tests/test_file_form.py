"""Weights kept in their file's form (refllama.numerics.matrices.FileMatrix): every GGUF type and the safetensors'
float16/bfloat16, memory-mapped, each product converting the matrix to float32 as it runs. Held bit-equal to the
float32 path they replace (the whole model converted at load), and bounded in memory."""

import json
import subprocess
import sys

import numpy as np
import pytest
from blas import assert_float32_products_close
from tiny_gguf import TINY, tiny_metadata, tiny_tensors, write_gguf

import refllama
from refllama.api import Model
from refllama.convert import convert
from refllama.formats.ggml_types import GGMLType as QT
from refllama.loader import load_gguf, load_hf
from refllama.numerics import matrices
from refllama.numerics.matrices import FILE_FORMS, FileMatrix, Scratch
from refllama.numerics.quant import KERNEL_TYPES, HalfMatrix
from refllama.xp import Placement

PROMPT = [3, 70, 101, 33, 200, 7, 12]


def float32_model(path, backend, loader=load_gguf):
    """The path being replaced: every tensor converted to float32 at load (refllama.xp.Placement)."""
    loaded = loader(path, Placement())
    return Model(str(path), loaded.config, loaded.weights, loaded.tokenizer, loaded.chat_template, backend, np, 64)


def same_run(a, b):
    """Prefill logits and three greedy decode steps, bit for bit."""
    assert np.array_equal(a.logits(PROMPT).view(np.uint32), b.logits(PROMPT).view(np.uint32))
    greedy = dict(max_tokens=3, temperature=0)
    assert list(a.generate(PROMPT, **greedy)) == list(b.generate(PROMPT, **greedy))


@pytest.mark.parametrize("qtype", sorted(FILE_FORMS, key=int), ids=lambda t: t.name)
def test_numpy_keeps_every_gguf_type_in_the_file_and_computes_as_float32(tmp_path, qtype):
    path = write_gguf(tmp_path / "m.gguf", tiny_metadata(), tiny_tensors(qtype))
    m = refllama.load(path, n_ctx=64, weights_in_file=True)
    q, embd = m.weights["layers"][0]["attn_q"], m.weights["token_embd"]
    assert isinstance(q, FileMatrix) and q.stored.qtype == qtype and isinstance(q.stored.raw, np.memmap)
    assert isinstance(embd, FileMatrix)  # read by rows, never converted whole
    same_run(m, float32_model(path, "numpy"))


@pytest.mark.slow
@pytest.mark.parametrize("qtype", sorted(FILE_FORMS - KERNEL_TYPES - {QT.F16, QT.BF16}, key=int), ids=lambda t: t.name)
def test_numba_keeps_the_types_without_a_kernel_in_the_file(tmp_path, qtype):
    path = write_gguf(tmp_path / "m.gguf", tiny_metadata(), tiny_tensors(qtype))
    m = refllama.load(path, backend="numba", n_ctx=64, threads=1, weights_in_file=True)
    assert type(m.weights["layers"][0]["ffn_down"]) is FileMatrix
    same_run(m, float32_model(path, "numba"))


@pytest.mark.slow
@pytest.mark.parametrize("qtype", [QT.F16, QT.BF16], ids=lambda t: t.name)
def test_numba_multiplies_16_bit_matrices_as_stored(tmp_path, qtype):
    """F16/BF16 on numba: a batch's product as FileMatrix (bit-equal), one token's a kernel on the 16-bit weights
    (float32 sums in its own order: within float32 rounding of the BLAS product)."""
    path = write_gguf(tmp_path / "m.gguf", tiny_metadata(), tiny_tensors(qtype))
    m = refllama.load(path, backend="numba", n_ctx=64, threads=1, weights_in_file=True)
    ref = float32_model(path, "numba")
    w = m.weights["layers"][0]["attn_output"]
    assert isinstance(w, HalfMatrix) and isinstance(w.stored.raw, np.memmap)
    assert np.array_equal(m.logits(PROMPT), ref.logits(PROMPT))
    x = np.random.default_rng(0).standard_normal((1, w.shape[1])).astype(np.float32)
    np.testing.assert_allclose(x @ w.T, x @ w.stored.to_float32().T, rtol=1e-5, atol=1e-6)
    for token in PROMPT:
        a, b = m.logits([token]), ref.logits([token])
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * np.ptp(b))


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_hf_16_bit_shards_stay_in_the_file_and_compute_as_float32(tmp_path, dtype):
    """An HF directory of 16-bit safetensors in several shards (refllama.convert --shard-gb), memory-mapped as
    stored, q/k rows reordered as stored; the same run as the directory converted whole at load."""
    gguf_path = write_gguf(tmp_path / "m.gguf", tiny_metadata(), tiny_tensors(QT.F16))
    d = convert(gguf_path, tmp_path / "hf", dtype, shard_gb=0.0005)
    assert len(json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]) > 0
    assert len(list(d.glob("model-*-of-*.safetensors"))) > 1
    m = refllama.load(d, n_ctx=64, weights_in_file=True)
    q, down = m.weights["layers"][0]["attn_q"], m.weights["layers"][0]["ffn_down"]
    assert isinstance(q, FileMatrix) and q.stored.qtype == (QT.BF16 if dtype == "bf16" else QT.F16)
    assert isinstance(down.stored.raw, np.memmap)  # as stored; attn_q's rows were reordered, a copy
    same_run(m, float32_model(d, "numpy", load_hf))


@pytest.fixture(scope="module")
def in_file(model):
    """SmolLM2 with its matrices in the file's form (a model this small is converted at load unless asked)."""
    return refllama.load(model.path, n_ctx=64, weights_in_file=True)


@pytest.mark.slow
def test_the_size_rule_keeps_big_models_in_the_file_and_converts_small_ones(model, in_file):
    from refllama.numerics.matrices import FilePlacement

    assert isinstance(model.weights["output"], np.ndarray) and isinstance(in_file.weights["output"], FileMatrix)
    big, small = FilePlacement(), FilePlacement()
    big.plan(matrices.FLOAT32_AT_LOAD + 1)
    small.plan(matrices.FLOAT32_AT_LOAD)
    assert big.keep == FILE_FORMS and small.keep == frozenset()
    same_run(model, in_file)


def test_a_matrix_larger_than_the_scratch_multiplies_in_row_blocks_as_it_would_whole(in_file, monkeypatch):
    """The vocabulary's matrix of a big model exceeds the scratch: its product in blocks of rows is the product of
    the whole float32 matrix (SmolLM2's 49152-row output matrix, cut into blocks of 14336 rows), within BLAS's
    float32 rounding (tests/blas.py: OpenBLAS sums a block's rows in another order than the whole's on some CPUs)."""
    whole = in_file.weights["output"]
    monkeypatch.setattr(matrices, "SCRATCH_VALUES", 8 << 20)
    blocked = FileMatrix(whole.stored, Scratch())
    assert blocked.block < whole.shape[0]
    W = whole.stored.to_float32()
    rng = np.random.default_rng(0)
    for T in (1, 2, 7, 64):
        x = rng.standard_normal((T, whole.shape[1])).astype(np.float32)
        assert_float32_products_close(x @ blocked.T, x @ W.T, x, W)


def test_the_scratch_is_shared_and_sized_by_the_largest_conversion(in_file):
    w = in_file.weights
    scratches = {id(m.scratch) for lw in w["layers"] for m in lw.values() if isinstance(m, FileMatrix)}
    assert len(scratches) == 1
    in_file.logits([1, 2, 3])
    largest = max(m.shape[0] * m.shape[1] for lw in [w, *w["layers"]] for m in lw.values() if isinstance(m, FileMatrix))
    assert len(w["output"].scratch.buf) == min(largest, matrices.SCRATCH_VALUES)


BOUND = 420 << 20  # measured: numpy 270 MiB over the file, numba 312; the float32 copy at load: 566
RSS = """
import sys
import refllama
m = refllama.load(sys.argv[1], backend=sys.argv[2], n_ctx=64, threads=1, weights_in_file=True)
m.logits(list(range(1, 33)))
print(next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""  # VmHWM, this program's peak: ru_maxrss would count the pytest process it was forked from


@pytest.mark.slow
@pytest.mark.parametrize("backend, qtype", [("numpy", QT.BF16), ("numba", QT.BF16), ("numba", QT.Q4_K),
                                            ("numba", QT.Q6_K)])
def test_an_8b_wide_layer_runs_in_little_more_memory_than_its_file(tmp_path, backend, qtype):
    """One layer with Llama-3.1-8B's widths (4096, 14336, GQA 32/8), 418 MiB in BF16: peak RSS stays under the file
    plus BOUND (the interpreter with refllama's imports, one matrix's scratch of 224 MiB, activations), which the
    float32 copy of the weights at load, twice the file, exceeds. Q4_K and Q6_K on numba: the kernels read the
    file's blocks in place, so no copy of them counts either."""
    dims = dict(TINY, n_layer=1, n_embd=4096, n_ff=14336, n_head=32, n_head_kv=8)
    path = write_gguf(tmp_path / "wide.gguf", tiny_metadata(dims), tiny_tensors(qtype, c=dims))
    size = path.stat().st_size
    r = subprocess.run([sys.executable, "-c", RSS, str(path), backend], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    peak = int(r.stdout.split()[-1])
    assert peak < size + BOUND, f"peak RSS {peak / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB file"


def test_an_hf_directory_that_cannot_fit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    """As for GGUF files: the float32 the load would allocate is counted first (the kept matrices take none)."""
    from refllama.formats import safety
    from refllama.numerics.matrices import FilePlacement

    d = convert(write_gguf(tmp_path / "m.gguf", tiny_metadata(), tiny_tensors(QT.F16)), tmp_path / "hf", "bf16")
    monkeypatch.setattr(safety, "available_memory", lambda xp=None: 64 << 10)
    with pytest.raises(refllama.RefllamaError, match=r"hf: the weights in float32 needs .* more than the"):
        load_hf(d, Placement())
    assert isinstance(load_hf(d, FilePlacement(in_file=True)).weights["layers"][0]["attn_q"], FileMatrix)
