"""The GPU path (refllama.numerics.gpu, gpu_decode): on the CPU, the decode step built from the kernels' NumPy
mirrors against the forward, and the 16-bit matrices against float32 products; with a GPU (CuPy and a device), each
CUDA kernel against its mirror and the graphed decode against the forward on the device. tools/gpu_check.py runs the
GPU half with the speed and memory figures."""

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from engine import write_safetensors_bf16
from families import GGUF, HF, names
from safetensors.numpy import load_file

import refllama
from refllama.api import Model
from refllama.formats.ggml_types import BLOCK_SIZES, QuantizedTensor
from refllama.formats.ggml_types import GGMLType as QT
from refllama.layers import rope_cos_sin
from refllama.loader import load_gguf, load_hf
from refllama.numerics import gpu
from refllama.numerics.gpu_decode import QKV, GraphDecoder, eligible, join_rows
from refllama.xp import to_numpy

DATA = Path(__file__).parent / "data"
PROMPT, STEPS = [1, 5, 9, 2, 7], [3, 11, 4, 8]
MODELS = {**{f"gguf-{f}": GGUF[f].gguf() for f in names(gpu_graph=True)},  # every model the graph reproduces
          **{f"tiny-{f}": DATA / f"tiny-{f}" for f, (_, graph) in HF.items() if graph},
          "qwen2-q4_k_m": DATA / "gguf-qwen2-kquant" / "qwen2-q4_k_m.gguf",
          "gemma3-q8_0": GGUF["gemma3"].gguf("q8_0")}


def rel(got, want):
    got, want = np.asarray(got), np.asarray(want)
    return float(np.abs(got - want).max() / np.abs(want).max())


def forward_steps(m, steps):  # -> the logits of each decode step after PROMPT, and the cache's K/V after them
    m.cache.reset()
    m.forward(PROMPT)
    out = [m.forward([t], len(PROMPT) + k) for k, t in enumerate(steps)]
    n = len(PROMPT) + len(steps)
    return [to_numpy(o) for o in out], [to_numpy(c[:, :n]).copy() for c in m.cache.k]


def decoder_steps(m, decoder, steps):
    m.cache.reset()
    m.forward(PROMPT)
    out = [decoder.step(t, len(PROMPT) + k) for k, t in enumerate(steps)]
    n = len(PROMPT) + len(steps)
    return [to_numpy(o) for o in out], [to_numpy(c[:, :n]).copy() for c in m.cache.k]


@pytest.mark.parametrize("name", MODELS)
def test_the_decode_step_equals_the_forward(name):
    """The graph's kernel sequence (their mirrors, on NumPy) gives each step's logits and K/V as the forward does,
    for both pair layouts, biases (Qwen2), per-head q/k norms (Qwen3), a sliding window shorter than the context
    (tiny Mistral's 5), Phi-3's fused matrices, Gemma 3's block (scaled embeddings, post-norms, GeGLU, local layers
    with their own RoPE base and window beside global ones, soft-capped logits)."""
    m = refllama.load(MODELS[name], n_ctx=32)
    assert eligible(m)
    want_logits, want_k = forward_steps(m, STEPS)
    got_logits, got_k = decoder_steps(m, GraphDecoder(m), STEPS)
    for got, want in zip(got_logits, want_logits, strict=True):
        assert got.shape == want.shape == (1, m.config.vocab_size)
        assert rel(got, want) < 1e-5
    for got, want in zip(got_k, want_k, strict=True):
        assert rel(got, want) < 1e-5
    assert [int(g.argmax()) for g in got_logits] == [int(w.argmax()) for w in want_logits]


def test_the_decode_step_joins_a_layers_matrices_without_a_copy():
    m = refllama.load(MODELS["tiny-qwen2"], n_ctx=32)
    q = m.weights["layers"][0]["attn_q"].copy()
    d = GraphDecoder(m)
    lw = m.weights["layers"][0]
    assert np.shares_memory(lw["attn_q"], d.layers[0].qkv) and np.shares_memory(lw["attn_v"], d.layers[0].qkv)
    np.testing.assert_array_equal(lw["attn_q"], q)
    assert d.layers[0].qkv_bias.shape == (d.layers[0].qkv.shape[0],)  # Qwen2's q/k/v biases, side by side


def test_matrices_of_several_kinds_stay_apart_and_multiply_as_their_float32_values():
    """q and k 16-bit of two kinds beside a float32 v (a GGUF's quantized v, converted at load): no matrix joined or
    widened, each multiplied into its own rows of the step's output, as their float32 values."""
    rng, scratch = np.random.default_rng(2), gpu.Scratch(np)
    parts = [gpu.GpuMatrix(bits(rng, (6, 16), "bf16"), "bf16", scratch),
             gpu.GpuMatrix(bits(rng, (4, 16), "f16"), "f16", scratch),
             rng.standard_normal((4, 16)).astype(np.float32)]
    want = np.concatenate([p.float32(0, p.shape[0]).copy() if isinstance(p, gpu.GpuMatrix) else p for p in parts])
    lw = dict(zip(QKV, parts, strict=True))
    joined = join_rows(lw, QKV)
    assert [(a, b) for _, a, b in joined] == [(0, 6), (6, 10), (10, 14)]
    assert all(lw[n] is p for n, p in zip(QKV, parts, strict=True))
    x, out = rng.standard_normal(16).astype(np.float32), np.zeros(14, np.float32)
    decoder = GraphDecoder.__new__(GraphDecoder)
    decoder.k = gpu.NumpyKernels()
    decoder.gemv(joined, x, out, np.arange(14, dtype=np.float32))
    np.testing.assert_allclose(out, want @ x + np.arange(14), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("family", GGUF)
def test_the_catalogue_says_which_families_the_graph_takes(family):
    assert eligible(refllama.load(GGUF[family].gguf(), n_ctx=32)) == GGUF[family].gpu_graph


def test_models_the_graph_does_not_reproduce_are_not_taken():
    """GPT-2's and the mixtures of experts' forwards have steps the kernels lack; numerics ggml rounds where the
    kernels do not: they stay ungraphed."""
    assert not eligible(refllama.load(DATA / "tiny-gpt2"))
    assert not eligible(refllama.load(DATA / "gguf-moe-kquant" / "qwen3moe-q4_k_m.gguf"))
    assert not eligible(refllama.load(MODELS["gguf-llama"], numerics="ggml"))


def bits(rng, shape, kind):  # random 16-bit weights' bits, finite, of either kind
    x = rng.standard_normal(shape).astype(np.float32)
    return x.astype(np.float16).view(np.uint16) if kind == "f16" else (x.view(np.uint32) >> 16).astype(np.uint16)


@pytest.mark.parametrize("kind", ("f16", "bf16"))
@pytest.mark.parametrize("K", (64, 36))  # whole 8-value loads, and a tail
def test_16bit_matrices_multiply_as_their_float32_values(kind, K):
    rng = np.random.default_rng(0)
    b = bits(rng, (40, K), kind)
    w32 = gpu.widen_numpy(b, kind)
    if kind == "bf16":
        np.testing.assert_array_equal(w32.view(np.uint32) & 0xFFFF, 0)
    else:
        np.testing.assert_array_equal(w32, b.view(np.float16).astype(np.float32))
    m = gpu.GpuMatrix(b, kind, gpu.Scratch(np))
    x = rng.standard_normal((3, K)).astype(np.float32)
    np.testing.assert_allclose(x[:1] @ m.T, x[:1] @ w32.T, rtol=1e-5, atol=1e-5)  # one token: the gemv
    np.testing.assert_array_equal(x @ m.T, x @ w32.T)  # several: widened, then the same product
    np.testing.assert_array_equal(m[np.array([4, 0])], w32[[4, 0]])
    np.testing.assert_array_equal(m.rows(3, 9).float32(0, 6), w32[3:9])


def random_blocks(rng, qtype, rows, K):  # [rows, row bytes] random blocks, their float16 scales finite
    """Every byte random but the scales (d, dmin, m: float16 at these offsets), drawn finite, some subnormal."""
    block, size = BLOCK_SIZES[qtype]
    b = rng.integers(0, 256, (rows * K // block, size), dtype=np.uint8)
    if qtype == QT.MXFP4:  # its scale one E8M0 byte: 2^-18 .. 2^12, the products finite
        b[:, 0] = rng.integers(110, 140, len(b))
    for at in SCALES[qtype]:
        d = rng.standard_normal(len(b)).astype(np.float32) * np.float32(10.0) ** rng.integers(-9, 2, len(b))
        b[:, at:at + 2] = d.astype(np.float16)[:, None].view(np.uint8)
    return b.reshape(rows, -1)


SCALES = {QT.Q4_0: (0,), QT.Q4_1: (0, 2), QT.Q5_0: (0,), QT.Q5_1: (0, 2), QT.Q8_0: (0,), QT.Q2_K: (80, 82),
          QT.Q3_K: (108,), QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,), QT.MXFP4: ()}


def assert_same_values(got, want):  # bit for bit, but any NaN for a NaN
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


HOST = r"""
#include <string.h>
#define __device__
#define __forceinline__ static inline
static inline float f16(unsigned int h) {
    unsigned short s = (unsigned short)h;
    _Float16 f;
    memcpy(&f, &s, 2);
    return f;
}
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
"""
# each type's runs of 8 values in order: a row of K values at a time, as the CUDA widen kernels walk them
HOST_ROWS = r"""
#define HOST_DQ(T, QK, BYTES) void host_##T(const unsigned char* W, float* out, long long n, int K) {              \
    for (long long t = 0; t < n; ++t) {                                                                          \
        int g = t % (K / 8) / 4;                                                                                 \
        dq_##T(W + t / (K / 8) * (K / QK) * BYTES + g / (QK / 32) * BYTES, g % (QK / 32), 8 * (t % 4), out + t * 8); \
    }                                                                                                            \
}
DQ_TYPES(HOST_DQ)
"""


def test_the_cuda_dequantizers_compute_gguf_pys_values_on_the_host(tmp_path):
    """cuda/dequant.cuh (gpu.DEQUANT) is plain C but for a few names: compiled by the host's C compiler (float16
    from _Float16, no fused multiply-add), every type's values equal gguf-py's dequantize bit for bit, as the loaders
    convert them."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler here (cc) to run the CUDA dequantizers' C on the host")
    src, lib = tmp_path / "dequant.c", tmp_path / "dequant.so"
    src.write_text(HOST + gpu.DQ_TYPES + "\n" + gpu.DEQUANT + HOST_ROWS)
    subprocess.run([cc, "-O2", "-ffp-contract=off", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    so, rng = ctypes.CDLL(str(lib)), np.random.default_rng(5)
    for qtype, kind in gpu.QUANT.items():
        K = 512
        raw = random_blocks(rng, qtype, 6, K)
        out = np.zeros((6, K), np.float32)
        getattr(so, f"host_{kind}")(raw.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
                                    ctypes.c_longlong(out.size // 8), ctypes.c_int(K))
        assert_same_values(out, QuantizedTensor(raw, qtype, (6, K)).to_float32())


@pytest.mark.parametrize("qtype", list(gpu.QUANT))
def test_quantized_matrices_multiply_as_their_float32_values(qtype):
    """The cupy backend's quantized matrix on its mirrors: one token's product (the gemv), several tokens' (widened,
    then the same product), embedding rows and row views, each as the float32 values gguf-py gives."""
    rng = np.random.default_rng(3)
    raw = random_blocks(rng, qtype, 12, 512)
    w32 = QuantizedTensor(raw, qtype, (12, 512)).to_float32()
    m = gpu.GpuMatrix(raw, gpu.QUANT[qtype], gpu.Scratch(np))
    assert m.shape == (12, 512) and m.nbytes == raw.nbytes
    x = rng.standard_normal((3, 512)).astype(np.float32)
    np.testing.assert_allclose(x[:1] @ m.T, x[:1] @ w32.T, rtol=1e-5, atol=1e-5 * np.abs(w32).max())
    np.testing.assert_array_equal(x @ m.T, x @ w32.T)
    assert_same_values(m[np.array([4, 0])], w32[[4, 0]])
    assert_same_values(m.rows(3, 9).float32(0, 6), w32[3:9])
    out = np.zeros(512, np.float32)
    gpu.NumpyKernels().embed(np.array([7], np.int32), m, out)
    assert_same_values(out, w32[7])


QUANTIZED = {p.stem: p for p in (*sorted((DATA / "gguf-qwen2-kquant").glob("*.gguf")),
                                  DATA / "gguf-llama" / "llama-q8_0.gguf")}


@pytest.mark.parametrize("name", QUANTIZED)
def test_a_quantized_gguf_on_the_gpu_placement_computes_its_float32_values(name):
    """The cupy backend's weights for a quantized GGUF (here on NumPy): every matrix kept in its blocks (GpuMatrix),
    and the logits those of the float32 arithmetic on the dequantized values, prefill and decode step (a layer's
    q/k/v of several types multiplied apart)."""
    path = QUANTIZED[name]
    loaded = load_gguf(path, gpu.GpuPlacement(np))
    kinds = {w.kind for lw in loaded.weights["layers"] for w in lw.values() if isinstance(w, gpu.GpuMatrix)}
    assert kinds and kinds <= set(gpu.QUANT.values())
    m = Model(str(path), loaded.config, loaded.weights, loaded.tokenizer, None, "numpy", np, 32)
    want = refllama.load(path, n_ctx=32)  # numpy: dequantized to float32 at load
    np.testing.assert_allclose(m.logits(PROMPT), want.logits(PROMPT), rtol=0, atol=1e-5)
    got_logits, _ = decoder_steps(m, GraphDecoder(m), STEPS)
    want_logits, _ = forward_steps(want, STEPS)
    assert max(rel(g, w) for g, w in zip(got_logits, want_logits, strict=True)) < 1e-5


UNGRAPHED = [(f, "q8_0") for f in (*names(recurrent=True), "gptoss", *names(latent=True), "glm45")] + [
    ("gptoss", "mxfp4")]


@pytest.mark.parametrize("family, qtype", UNGRAPHED)
def test_families_the_graph_does_not_take_compute_their_float32_values_on_the_placement(family, qtype):
    """The cupy backend's weights for the hybrids', gpt-oss's, DeepSeek's and GLM-4.5's quantized files (here on
    NumPy: its CPU mirror; MXFP4 experts kept in their blocks; DeepSeek's k_b transposed to float32) give float32's
    logits, prefill and decode steps without the decode graph (whose kernels have no recurrence, no sinks, no
    experts, no latent attention)."""
    path = GGUF[family].gguf(qtype)
    loaded = load_gguf(path, gpu.GpuPlacement(np))
    assert any(isinstance(w, gpu.GpuMatrix) for w in loaded.weights["layers"][0].values())
    m = Model(str(path), loaded.config, loaded.weights, loaded.tokenizer, None, "numpy", np, 64)
    want = refllama.load(path, n_ctx=64)
    ids = [1, 5, 9, 2, 7, 3, 11, 4]
    np.testing.assert_allclose(m.logits(ids), want.logits(ids), rtol=0, atol=1e-5)
    for k, t in enumerate([8, 6]):
        np.testing.assert_allclose(m.forward([t], len(ids) + k), want.forward([t], len(ids) + k), rtol=0, atol=1e-5)
    assert not eligible(m)


def bf16_copy(name, tmp_path):  # a tiny family's HF directory with its tensors in bfloat16
    d = tmp_path / f"{name}-bf16"
    shutil.copytree(DATA / f"tiny-{name}", d)
    write_safetensors_bf16(d / "model.safetensors", load_file(DATA / f"tiny-{name}" / "model.safetensors"), {})
    return d


@pytest.mark.parametrize("in_file", (None, False))
def test_a_bfloat16_model_on_the_gpu_placement_computes_its_float32_values(tmp_path, in_file):
    """The cupy backend's weights (here on NumPy): bfloat16 matrices kept so (GpuMatrix) or widened at load, and
    either way the logits of the float32 arithmetic on the same values, prefill and decode step."""
    d = bf16_copy("qwen2", tmp_path)
    loaded = load_hf(d, gpu.GpuPlacement(np, in_file))
    assert isinstance(loaded.weights["layers"][0]["attn_q"], gpu.GpuMatrix) == (in_file is None)
    m = Model(str(d), loaded.config, loaded.weights, loaded.tokenizer, None, "numpy", np, 32)
    want = refllama.load(d, n_ctx=32)  # numpy: the bfloat16 values converted to float32 at load
    np.testing.assert_allclose(m.logits(PROMPT), want.logits(PROMPT), rtol=0, atol=1e-5)
    got_logits, _ = decoder_steps(m, GraphDecoder(m), STEPS)
    want_logits, _ = forward_steps(want, STEPS)
    assert max(rel(g, w) for g, w in zip(got_logits, want_logits, strict=True)) < 1e-5


# --- on a GPU: each kernel against its mirror, the graph against the forward (skipped without one) ---

def cupy_or_skip():
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
    except Exception as e:  # CuPy absent, or no driver
        pytest.skip(f"no CUDA GPU here ({type(e).__name__})")
    pytest.skip("no CUDA GPU here")


def test_each_cuda_kernel_equals_its_mirror():
    cp = cupy_or_skip()
    cuda, mirror, rng = gpu.kernels(cp), gpu.NumpyKernels(), np.random.default_rng(1)

    def both(name, *args, out):  # run a kernel and its mirror on the same inputs; compare the outputs
        outs = []
        for k, xp in ((cuda, cp), (mirror, np)):
            o = [xp.asarray(a.copy()) for a in out]
            a = [xp.asarray(v) if isinstance(v, np.ndarray) else v for v in args]
            getattr(k, name)(*a, *o)
            outs.append([to_numpy(v) for v in o])
        for g, w in zip(*outs, strict=True):
            assert rel(g, w) < 2e-6, name

    f32 = np.float32
    for K in (256, 37):
        W, x = rng.standard_normal((70, K)).astype(f32), rng.standard_normal(K).astype(f32)
        both("gemv", W, x, out=[np.zeros(70, f32)])
        for kind in ("f16", "bf16"):
            b = bits(rng, (70, K), kind)
            outs = []
            for k, xp in ((cuda, cp), (mirror, np)):
                o = xp.zeros(70, xp.float32)
                k.gemv(gpu.GpuMatrix(xp.asarray(b), kind, gpu.Scratch(xp)), xp.asarray(x), o,
                       bias=xp.asarray(x[:1].repeat(70)), res=xp.asarray(W[:, 0].copy()))
                outs.append(to_numpy(o))
            assert rel(*outs) < 2e-6, kind
    x, w = rng.standard_normal((3, 200)).astype(f32), rng.standard_normal(200).astype(f32)
    both("rms_norm", x, w, 1e-5, out=[np.zeros((3, 200), f32)])
    H, KVH, HD, n_ctx = 4, 2, 48, 16
    cos, sin = rope_cos_sin(n_ctx, 32, 10000.0)  # a partial rotary: 32 of 48 dims
    for layout in ("half", "interleaved"):
        for norms in (None, (rng.standard_normal(HD).astype(f32), rng.standard_normal(HD).astype(f32))):
            qkv = rng.standard_normal((H + 2 * KVH) * HD).astype(f32)
            caches = [rng.standard_normal((KVH, n_ctx, HD)).astype(f32) for _ in range(2)]
            outs = []
            for k, xp in ((cuda, cp), (mirror, np)):
                q, kc, vc = xp.zeros(H * HD, xp.float32), xp.asarray(caches[0]), xp.asarray(caches[1])
                qn, kn = (None, None) if norms is None else map(xp.asarray, norms)
                k.rope_store(xp.asarray(qkv), xp.asarray(cos), xp.asarray(sin), xp.asarray(np.array([7], np.int32)),
                             q, kc, vc, qn, kn, 1e-6, (H, KVH, HD), layout)
                outs.append([to_numpy(a) for a in (q, kc, vc)])
            for g, w in zip(*outs, strict=True):
                assert rel(g, w) < 2e-6, layout
    for window in (None, 4):
        q = rng.standard_normal(H * HD).astype(f32)
        kc, vc = (rng.standard_normal((KVH, n_ctx, HD)).astype(f32) for _ in range(2))
        outs = []
        for k, xp in ((cuda, cp), (mirror, np)):
            o = xp.zeros(H * HD, xp.float32)
            k.attention(xp.asarray(q), xp.asarray(kc), xp.asarray(vc), xp.asarray(np.array([9], np.int32)),
                        xp.zeros((H, n_ctx), xp.float32), o, 0.125, (H, KVH, HD), window)
            outs.append(to_numpy(o))
        assert rel(*outs) < 2e-6, window
    for layout in ("half", "interleaved"):
        x = rng.standard_normal((5, 3, HD)).astype(f32)
        both("rope", x, cos[2:7], sin[2:7], layout, out=[np.zeros((5, 3, HD), f32)])
    g, u = (rng.standard_normal((3, 100)).astype(f32) * 8 for _ in range(2))
    both("swiglu", g, u, out=[np.zeros((3, 100), f32)])
    both("geglu", g, u, out=[np.zeros((3, 100), f32)])
    x, w, res = (rng.standard_normal(shape).astype(f32) for shape in ((3, 200), 200, (3, 200)))
    outs = []
    for k, xp in ((cuda, cp), (mirror, np)):  # a post-norm added to the residual; the in-place steps
        o, y, z = xp.zeros((3, 200), xp.float32), xp.asarray(g * 3), xp.asarray(g.copy())
        k.rms_norm(xp.asarray(x), xp.asarray(w), 1e-6, o, res=xp.asarray(res))
        k.scale(y, 45.25)
        k.softcap(z, 5.0)
        outs.append([to_numpy(a) for a in (o, y, z)])
    for got, want in zip(*outs, strict=True):
        assert rel(got, want) < 2e-6
    kq = rng.standard_normal((4, 3, 40)).astype(f32) * 5
    both("softmax_rows", kq, refllama.layers.causal_mask(37, 3, 40, np, window=30), 0.3,
         out=[np.zeros((4, 3, 40), f32)])
    for kind in ("f16", "bf16"):
        b = bits(rng, (5, 40), kind)
        outs = []
        for k, xp in ((cuda, cp), (mirror, np)):
            o = xp.zeros(40, xp.float32)
            k.embed(xp.asarray(np.array([3], np.int32)), gpu.GpuMatrix(xp.asarray(b), kind, gpu.Scratch(xp)), o)
            outs.append(to_numpy(o))
        np.testing.assert_array_equal(*outs)


def test_each_quantized_types_cuda_kernels_equal_their_mirrors():
    """Widening (prefill's products, embeddings) gives gguf-py's values bit for bit; the gemv, the float32 product
    of those values."""
    cp = cupy_or_skip()
    cuda, mirror, rng = gpu.kernels(cp), gpu.NumpyKernels(), np.random.default_rng(4)
    for qtype, kind in gpu.QUANT.items():
        raw = random_blocks(rng, qtype, 70, 768)
        want = QuantizedTensor(raw, qtype, (70, 768)).to_float32()
        m = gpu.GpuMatrix(cp.asarray(raw), kind, gpu.Scratch(cp))
        assert_same_values(to_numpy(m.float32(0, 70)), want)
        assert_same_values(to_numpy(m[np.array([5, 69, 0])]), want[[5, 69, 0]])
        out = cp.zeros(768, cp.float32)
        cuda.embed(cp.asarray(np.array([9], np.int32)), m, out)
        assert_same_values(to_numpy(out), want[9])
        finite = np.isfinite(want).all(axis=1)
        x, bias, res = (rng.standard_normal(n).astype(np.float32) for n in (768, 70, 70))
        outs = []
        for k, xp, w in ((cuda, cp, m), (mirror, np, gpu.GpuMatrix(raw, kind, gpu.Scratch(np)))):
            o = xp.zeros(70, xp.float32)
            k.gemv(w, xp.asarray(x), o, bias=xp.asarray(bias), res=xp.asarray(res))
            outs.append(to_numpy(o)[finite])
        assert rel(*outs) < 2e-6, kind


def test_quantized_weights_stay_quantized_on_the_gpu():
    cp = cupy_or_skip()
    path = QUANTIZED["qwen2-q4_k_m"]
    m = refllama.load(path, backend="cupy", n_ctx=32)
    w = m.weights["layers"][0]["ffn_down"]
    assert isinstance(w, gpu.GpuMatrix) and w.raw.dtype == cp.uint8 and w.kind in ("q4_k", "q6_k")
    want = refllama.load(path, n_ctx=32)
    assert rel(m.logits(PROMPT), want.logits(PROMPT)) < 1e-5
    got, _ = forward_steps(m, STEPS)
    ref, _ = forward_steps(want, STEPS)
    assert max(rel(g, r) for g, r in zip(got, ref, strict=True)) < 1e-5


@pytest.mark.parametrize("name", MODELS)
def test_the_graphed_decode_equals_the_forward_on_the_gpu(name):
    cupy_or_skip()
    m = refllama.load(MODELS[name], backend="cupy", n_ctx=32)
    m.graph = False
    want_logits, want_k = forward_steps(m, STEPS)
    m.graph = True
    got_logits, got_k = forward_steps(m, STEPS)
    assert m.decoder and m.decoder.graph, "the decode step was not captured as a graph"
    assert max(rel(g, w) for g, w in zip(got_logits, want_logits, strict=True)) < 1e-5
    assert max(rel(g, w) for g, w in zip(got_k, want_k, strict=True)) < 1e-5
    assert [int(g.argmax()) for g in got_logits] == [int(w.argmax()) for w in want_logits]


def test_bfloat16_weights_stay_16_bit_on_the_gpu(tmp_path):
    cp = cupy_or_skip()
    d = bf16_copy("llama", tmp_path)
    m = refllama.load(d, backend="cupy", n_ctx=32)
    w = m.weights["layers"][0]["ffn_down"]
    assert isinstance(w, gpu.GpuMatrix) and w.raw.dtype == cp.uint16
    want = refllama.load(d, n_ctx=32)
    assert rel(m.logits(PROMPT), want.logits(PROMPT)) < 1e-5
    got, _ = forward_steps(m, STEPS)
    ref, _ = forward_steps(want, STEPS)
    assert max(rel(g, r) for g, r in zip(got, ref, strict=True)) < 1e-5
