"""Numba kernels on quantized blocks, against gguf's own dequantization: `dequantize(W) @ x`."""

import os
import subprocess
import sys

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from tiny_gguf import tiny_metadata, tiny_tensors, write_gguf

import refllama
from refllama.numerics.quant import KERNEL_TYPES, QuantMatrix

rng = np.random.default_rng(0)


def random_blocks(qtype, shape):
    # bytes in [0, 0x3B]: every float16 scale inside a block is finite
    return rng.integers(0, 0x3C, size=gguf.quant_shape_to_byte_shape(shape, qtype), dtype=np.uint8)


@pytest.mark.slow
@pytest.mark.parametrize("T", [1, 5], ids=["decode", "prefill"])
@pytest.mark.parametrize("shape", [(64, 512), (300, 256), (30, 256)])  # 30: rows not a multiple of 4
@pytest.mark.parametrize("qtype", sorted(KERNEL_TYPES, key=lambda t: t.value), ids=lambda t: t.name)
def test_kernel_equals_gguf_dequantize_then_matmul(qtype, shape, T):
    raw = random_blocks(qtype, shape)
    W = gguf.quants.dequantize(raw, qtype)  # [N, K] float32, gguf-py's reference dequantization
    x = rng.standard_normal((T, shape[1])).astype(np.float32)
    got, want = x @ QuantMatrix([raw], qtype, shape[1]).T, x @ W.T
    # float32 sums in another order: error ~1e-7 of the largest output
    np.testing.assert_allclose(got, want, atol=2e-6 * np.abs(want).max(), rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("qtype", sorted(KERNEL_TYPES, key=lambda t: t.value), ids=lambda t: t.name)
def test_rows_dequantize_exactly(qtype):
    raw = random_blocks(qtype, (40, 256))
    W = gguf.quants.dequantize(raw, qtype)
    q = QuantMatrix([raw], qtype, 256)
    np.testing.assert_array_equal(q[[0, 7, 39, 7]], W[[0, 7, 39, 7]])
    with pytest.raises(IndexError):
        q[[0, 40]]  # the kernel reads rows unchecked: the lookup refuses rows past the end
    assert q.nbytes < W.nbytes / 3  # quantized in memory: at most 8.5 bits of 32 (Q8_0)


@pytest.mark.slow
@pytest.mark.parametrize("qtype", sorted(KERNEL_TYPES, key=lambda t: t.value), ids=lambda t: t.name)
def test_matrix_is_the_file_bytes_in_place(qtype):
    raw = random_blocks(qtype, (40, 256))
    q = QuantMatrix([raw[:24], raw[24:]], qtype, 256)  # two parts, as a fused matrix's
    assert q.nbytes == raw.nbytes and all(np.shares_memory(p, raw) for p in q.parts)  # no copy, no repacking
    x = rng.standard_normal((3, 256)).astype(np.float32)
    np.testing.assert_array_equal(x[:1] @ q.T, x[:1] @ QuantMatrix([raw], qtype, 256).T)
    np.testing.assert_array_equal(x @ q.T, x @ QuantMatrix([raw], qtype, 256).T)
    np.testing.assert_array_equal(q[[39, 0, 24, 23]], gguf.quants.dequantize(raw, qtype)[[39, 0, 24, 23]])
    with pytest.raises(ValueError, match="take"):
        QuantMatrix([raw[:, :-1]], qtype, 256)


@pytest.mark.slow
def test_q4_0_offset_of_the_largest_float16_scale_stays_exact():
    raw = random_blocks(QT.Q4_0, (4, 64))
    raw.reshape(4, 2, 18)[0, 0, :2] = np.frombuffer(np.float16(60000).tobytes(), np.uint8)  # -8 d overflows float16
    W = gguf.quants.dequantize(raw, QT.Q4_0)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    q = QuantMatrix([raw], QT.Q4_0, 64)
    np.testing.assert_array_equal(q[[0]], W[[0]])
    np.testing.assert_allclose(x @ q.T, x @ W.T, rtol=1e-5, atol=1e-3)


@pytest.mark.slow
def test_numba_backend_keeps_smollm2_quantized(model):
    m = refllama.load(model.path, backend="numba", n_ctx=256)
    q = m.weights["layers"][0]["attn_q"].fused.whole  # q, k and v multiplied as one matrix (quant.Fused)
    assert isinstance(q, QuantMatrix) and q.qtype == QT.Q4_1 and q.shape == (576 + 2 * 192, 576)
    assert all(isinstance(p.base, np.memmap) for p in q.parts)  # the file's pages, not a copy
    assert isinstance(m.weights["token_embd"], QuantMatrix) and m.weights["token_embd"].qtype == QT.Q8_0
    ids = model.tokenize("The history of the printing press begins")
    np.testing.assert_allclose(m.logits(ids), model.logits(ids), atol=1e-3 * np.ptp(model.logits(ids)))
    greedy = dict(max_tokens=20, temperature=0)
    assert list(m.generate(ids, **greedy)) == list(model.generate(ids, **greedy))


@pytest.mark.slow
def test_unsupported_types_fall_back_with_one_notice(tmp_path):
    path = write_gguf(tmp_path / "q3.gguf", tiny_metadata(), tiny_tensors(QT.Q3_K))
    r = subprocess.run([sys.executable, "-c", f"import refllama; m = refllama.load({str(path)!r}, backend='numba');"
                        "print(type(m.weights['layers'][0]['attn_q']).__name__)"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ndarray"
    assert r.stderr.strip() == "refllama: no numba kernel for Q3_K: those tensors are dequantized to float32"
    r = subprocess.run([sys.executable, "-c", f"import refllama; m = refllama.load({str(path)!r}, backend='numba', "
                        "weights_in_file=True); print(type(m.weights['layers'][0]['attn_q']).__name__)"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "FileMatrix"
    assert r.stderr.strip() == ("refllama: no numba kernel for Q3_K: those matrices are converted to float32 as each "
                                "product runs")


def _resident_kb(pattern):  # resident KB of this process's read-only mappings of files matching pattern
    total, match = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                match = len(fields) > 5 and pattern in fields[-1] and "w" not in fields[1]
            elif match and fields[0] == "Rss:":
                total += int(fields[1])
    return total


@pytest.mark.slow
@pytest.mark.alone  # MADV_PAGEOUT leaves the pages another process maps too (another worker's LLVM)
@pytest.mark.skipif(not sys.platform.startswith("linux") or tuple(map(int, os.uname().release.split(".")[:2])) < (5, 4),
                    reason="MADV_PAGEOUT needs Linux 5.4+")
def test_released_loader_pages_leave_kernels_and_hashing_working():
    import hashlib

    from numba import njit

    from refllama.numerics.kernel_pages import release_loader_pages

    raw = random_blocks(QT.Q4_1, (8, 256))
    x = rng.standard_normal((1, 256)).astype(np.float32)
    want = x @ gguf.quants.dequantize(raw, QT.Q4_1).T
    assert njit(lambda a: a + 1)(1) == 2  # compiling something new makes LLVM's pages resident again
    before = _resident_kb("libllvmlite")
    release_loader_pages()
    assert _resident_kb("libllvmlite") < before / 2
    np.testing.assert_allclose(x @ QuantMatrix([raw], QT.Q4_1, 256).T, want, rtol=1e-5, atol=1e-5)
    assert hashlib.sha256(b"abc").hexdigest().startswith("ba7816bf")
