"""The operations tables (refllama.layers.Ops): one per numerics and backend, chosen once at load, through which every
forward calls the steps whose arithmetic a numerics sets. Each table computes the float32 table's steps on the
shapes the forwards pass them (a norm over rows [T, D] and over heads [T, H, HD], one token and a batch), within
its numerics' distance from float32; the Numba tables of numerics "ggml" are their NumPy twin to the bit."""

import numpy as np
import pytest
from tiers import param

from refllama import arch as archs
from refllama.layers import FLOAT32, Ops, causal_mask
from refllama.numerics import ggml_kernels, ggml_numerics, gpu, numba_ops, resolve
from refllama.numerics.cpu_paths import EMULATED

TABLES = {"float32": FLOAT32, "float32-numba": numba_ops.OPS, "ggml": ggml_numerics.OPS, "ggml-numba": ggml_kernels.OPS,
          "float32-cupy": gpu.OPS}  # here on NumPy: the CUDA kernels' host code around their mirrors
# worst |table - float32| over the largest |float32|: float32 sums in another order (float32-numba); operands rounded
# to float16 (q, softmax weights, GELU's table) and ggml's expf (ggml)
TOLERANCE = {"float32": 0.0, "float32-numba": 1e-5, "ggml": 4e-3, "ggml-numba": 4e-3, "float32-cupy": 0.0}
H, KVH, HD, D, F, CTX = 8, 2, 64, 128, 256, 16


def calls(T, rng):
    """Each step with arguments of the shapes and kinds a forward passes at T new tokens after 3 cached ones."""
    def randn(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    S = 3 + T
    cos, sin = FLOAT32.rope_cos_sin(CTX, HD, 10000.0)
    cache = np.zeros((KVH, CTX, HD), np.float32)  # K and V are views of the cache, holding float16 values
    cache[:, :S] = ggml_numerics.round_f16(randn(KVH, S, HD))
    kq = randn(H, T, S) * 4
    qk = randn(2, T, 3, 36)  # a linear layer's q, k (L2-normalised), 3 v heads, 36 wide: a tail past ggml's vectors
    qk /= np.sqrt((qk * qk).sum(-1, keepdims=True))
    delta_args = (*qk, randn(T, 3, 24), -np.abs(randn(T, 3)), rng.uniform(0, 1, (T, 3)).astype(np.float32),
                  randn(3, 24, 36) * 0.5)  # v [T, H, dv], log decay, beta; the state [H, dv, dk] before them
    return {
        "rms_norm rows": lambda ops: ops.rms_norm(randn(T, D) * 3, randn(D), 1e-5),
        "rms_norm heads": lambda ops: ops.rms_norm(randn(T, H, HD) * 3, randn(HD), 1e-6),  # Qwen3's, Gemma 3's
        "rope interleaved": lambda ops: ops.rope["interleaved"](randn(T, H, HD), cos[3:S], sin[3:S]),
        "rope half": lambda ops: ops.rope["half"](randn(T, H, HD), cos[3:S], sin[3:S]),
        "rope_cos_sin": lambda ops: np.stack(ops.rope_cos_sin(CTX, HD, 10000.0, 2.0, 1.0, np.linspace(1, 4, HD // 2))),
        "attention_scores": lambda ops: ops.attention_scores(randn(T, H, HD), cache[:, :S]),
        "attention_weights": lambda ops: ops.attention_weights(kq, causal_mask(3, T, S, np), 0.125),
        "attention_mix": lambda ops: ops.attention_mix(FLOAT32.attention_weights(kq, causal_mask(3, T, S, np), 0.125),
                                                       cache[:, :S]),
        "swiglu": lambda ops: ops.swiglu(randn(T, F) * 3, randn(T, F)),
        "gelu": lambda ops: ops.gelu(randn(T, F) * 3),
        "geglu": lambda ops: ops.geglu(randn(T, F) * 3, randn(T, F)),
        "gated_delta_net": lambda ops: np.concatenate([a.ravel() for a in ops.gated_delta_net(*delta_args)]),
    }


def run(ops, T, step):  # the same random arguments for every table
    return calls(T, np.random.default_rng([T, STEPS.index(step)]))[step](ops)


STEPS = list(calls(1, np.random.default_rng(0)))


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("T", [1, 5], ids=["decode", "batch"])
@pytest.mark.parametrize("name", [param(n, fast="numba" not in n) for n in TABLES])  # Numba: the slow tier
def test_every_table_computes_the_float32_steps(name, T, step):
    want, got = run(FLOAT32, T, step), run(TABLES[name], T, step)
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.abs(got - want).max() <= TOLERANCE[name] * np.abs(want).max(), np.abs(got - want).max()


@pytest.mark.slow
@pytest.mark.parametrize("path", EMULATED["numba"])
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("T", [1, 5], ids=["decode", "batch"])
def test_numerics_ggml_on_numba_is_its_numpy_emulation_to_the_bit(T, step, path):
    """On every CPU path numerics ggml reproduces (its lanes and expf)."""
    kernels, emulation = ggml_kernels.path_ops(path), ggml_numerics.path_ops(path)
    assert np.array_equal(run(kernels, T, step), run(emulation, T, step))


def ops_for(backend, numerics, arch):
    return resolve(backend, numerics, "avx512-vnni" if numerics == "ggml" else None, xp=np).ops(arch)


def test_a_table_is_chosen_once_from_backend_and_numerics():
    llama, gemma3 = archs.get("llama"), archs.get("gemma3")
    assert ops_for("numpy", "float32", llama) is FLOAT32 and ops_for("cupy", "float32", gemma3) is gpu.OPS
    assert ops_for("numba", "float32", gemma3) is numba_ops.OPS
    for backend, table in (("numpy", ggml_numerics.OPS), ("numba", ggml_kernels.OPS)):
        assert ops_for(backend, "ggml", gemma3) == table and ops_for(backend, "ggml", gemma3).q_first
        assert ops_for(backend, "ggml", llama) == table._replace(q_first=False)  # llama.cpp scales the scores
    chosen = resolve("numpy", "ggml", "avx2", repack=False)
    assert (chosen.name, chosen.cpu_path, chosen.repack, chosen.notice) == ("ggml", "avx2", False, None)
    assert chosen.placement.path == "avx2" and not chosen.placement.repack
    for table in TABLES.values():
        assert isinstance(table, Ops) and set(table.rope) == {"interleaved", "half"}
        flags = ("kv_f16", "q_first", "mla_absorbed")
        steps = [f for name, f in table._asdict().items() if name not in ("rope", *flags)]
        assert all(callable(f) for f in [*steps, *table.rope.values()])
        assert all(isinstance(getattr(table, flag), bool) for flag in flags)
    assert [t.kv_f16 for t in TABLES.values()] == [False, False, True, True, False]  # llama.cpp's float16 cache


def test_the_model_computes_through_its_table(model):
    """Every step of a forward goes through `model.ops`: a table whose steps each count their calls sees all of
    them in one decode step of SmolLM2 (30 layers)."""
    counts = {}

    def counted(name, f):
        def step(*args):
            counts[name] = counts.get(name, 0) + 1
            return f(*args)
        return step

    ops = model.ops
    spy = ops._replace(**{n: counted(n, getattr(ops, n)) for n in ops._fields if n not in ("rope", "kv_f16")},
                       rope={k: counted("rope", f) for k, f in ops.rope.items()})
    model.ops = spy
    try:
        model.cache.reset()
        model.forward([1, 2, 3], 0, last_only=True)
    finally:
        model.ops = ops
    L = model.config.n_layer
    assert counts == {"rms_norm": 2 * L + 1, "rope": 2 * L, "attention_scores": L, "attention_weights": L,
                      "attention_mix": L, "swiglu": L}
