"""refllama.numerics.numba_ops (numerics float32 on --backend numba): one token's small steps as Numba kernels, against
refllama.layers' NumPy forms of the same float32 arithmetic."""

import os
import subprocess
import sys

import numpy as np
import pytest
from numba.core.registry import CPUDispatcher as Dispatcher

from refllama import layers
from refllama.numerics import ggml_blocks, ggml_kernels, numba_ops
from refllama.numerics.kernel_pages import warm_up_steps

pytestmark = pytest.mark.slow  # Numba's kernels, compiled cold: the slow tier (the fast one holds their NumPy forms)

rng = np.random.default_rng(0)


def randn(*shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("T", [1, 3])
def test_rms_norm_is_layers_to_the_bit(T):
    x, w = randn(T, 576) * 3, randn(576)
    assert np.array_equal(numba_ops.rms_norm(x, w, 1e-5), layers.rms_norm(x, w, 1e-5))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("rope_dim", [64, 32], ids=["full", "partial"])
def test_rope_equals_layers(layout, rope_dim):  # ggml's fused multiply-adds: within an ulp
    x, cos, sin = randn(2, 3, 64), randn(2, rope_dim // 2), randn(2, rope_dim // 2)
    np.testing.assert_allclose(numba_ops.OPS.rope[layout](x, cos, sin), layers.ROPE[layout](x, cos, sin), rtol=1e-6,
                               atol=1e-6)


def attention(ops, q, k, v, mask):  # scores, softmax weights, mix
    kq = ops.attention_scores(q, k)
    p = ops.attention_weights(kq, mask, 0.125)
    return kq, p, ops.attention_mix(p, v)


@pytest.mark.parametrize("S", [1, 37, 300], ids=["first", "middle", "whole-cache"])
@pytest.mark.parametrize("HD", [64, 128, 96])  # 96: the mix is not whole 64-lane chunks, so NumPy's
def test_one_token_attention_equals_layers(HD, S):
    K, V = randn(3, 300, HD), randn(3, 300, HD)  # a cache of 300 positions; S of them cached
    q, mask = randn(1, 9, HD), layers.causal_mask(S - 1, 1, S, np)
    got = attention(numba_ops.OPS, q, K[:, :S], V[:, :S], mask)
    want = attention(layers.FLOAT32, q, K[:, :S], V[:, :S], mask)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * np.abs(w).max())  # float32 sums in another order


def test_a_batch_is_layers_itself():
    K, V, q = randn(3, 20, 64), randn(3, 20, 64), randn(4, 9, 64)
    mask = layers.causal_mask(16, 4, 20, np)
    for g, w in zip(attention(numba_ops.OPS, q, K, V, mask), attention(layers.FLOAT32, q, K, V, mask), strict=True):
        assert np.array_equal(g, w)


def loaded():  # kernel name -> how many compiled forms Numba holds, for the numba numerics' modules
    return {(mod.__name__, name): len(f.signatures) for mod in (numba_ops, ggml_kernels, ggml_blocks)
            for name, f in vars(mod).items() if isinstance(f, Dispatcher)}


@pytest.mark.parametrize("ops", [numba_ops.OPS, ggml_kernels.OPS], ids=["float32", "ggml"])
def test_warm_up_loads_every_form_a_step_calls(ops):
    warm_up_steps(ops, 64)
    before = loaded()
    K, x, cs = randn(3, 8, 64), randn(1, 9, 64), randn(1, 32)
    ops.rms_norm(x[0], x[0, 0], 1e-5)
    ops.rms_norm(x, x[0, 0], 1e-5)  # per-head norms
    ops.rope["interleaved"](x, cs, cs)
    ops.swiglu(x[0], x[0])
    ops.swiglu(x[0, :, :32], x[0, :, 32:])  # a batch's gate and up: columns of one product
    for S in (5, 8):  # part of the cache (strided), all of it (contiguous)
        attention(ops, x, K[:, :S], K[:, :S], layers.causal_mask(S - 1, 1, S, np))
    assert loaded() == before


@pytest.mark.skipif(not sys.platform.startswith("linux") or tuple(map(int, os.uname().release.split(".")[:2])) < (5, 4),
                    reason="MADV_PAGEOUT needs Linux 5.4+")
@pytest.mark.parametrize("numerics", ["float32", "ggml"])
@pytest.mark.parametrize("which", ["smollm2", "gemma3"])  # Gemma 3: K-quant matrices, GELU
def test_generating_to_the_end_of_the_context_loads_nothing_after_load(model, numerics, which, request):
    """Every kernel is loaded before the loader releases LLVM's pages: none comes back (~10 MB) during a prefill and
    decode steps up to the context's last position."""
    path = model.path if which == "smollm2" else request.getfixturevalue("gemma3_path")
    code = f"""
import numpy as np, refllama
from test_quant import _resident_kb

m = refllama.load({path!r}, backend="numba", n_ctx=16, numerics={numerics!r})
before = _resident_kb("libllvmlite")
m.forward(list(range(100, 110)), 0, True)
for pos in range(10, 16):
    m.forward([5], pos, True)
print(_resident_kb("libllvmlite") - before)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=os.path.dirname(__file__))
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) < 2048  # KB of LLVM's code made resident again
