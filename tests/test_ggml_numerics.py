"""numerics "ggml": the NumPy emulation of llama.cpp's CPU arithmetic (refllama.numerics.ggml_numerics) and its Numba
kernels (refllama.numerics.ggml_kernels) agree to the bit, and their parts follow ggml's rules. Agreement with llama.cpp
itself, stage by stage on SmolLM2, is the checkpoint suite's ggml column (checkpoints/README.md)."""

import itertools
import math

import gguf
import llvmlite.binding
import numba
import numpy as np
import pytest
from gguf.quants import dequantize
from numba import njit

import refllama
from refllama.formats.ggml_types import GGMLType as QT
from refllama.formats.ggml_types import byte_shape
from refllama.layers import linear
from refllama.numerics import ggml_blocks as gb
from refllama.numerics import ggml_float as gf
from refllama.numerics import ggml_kernels as gk
from refllama.numerics import ggml_kquants as gq
from refllama.numerics import ggml_numerics as gn
from refllama.numerics import ggml_quantize as gz
from refllama.numerics import ggml_tables as gt
from refllama.numerics.cpu_paths import EMULATED
from refllama.numerics.matrices import Fused, fuse_layer, mul_mat_id
from refllama.numerics.quant import QuantMatrix, concat_blocks

RNG = np.random.default_rng(20261123)
LEGACY = (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0)
K_QUANTS = (QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K)


def activations(T, K):
    """Awkward rows: ordinary values, an all-zero block, a block whose largest |x| is negative, exact .5 ties
    of x * 127 / amax, and a block small enough for float16's subnormal scales."""
    x = (RNG.standard_normal((T, K)) * 3).astype(np.float32)
    x[0, :32] = 0
    x[-1, 32:64] *= -1
    x[-1, 32] = -50
    x[0, 64:96] = np.arange(32, dtype=np.float32) - 15.5  # with amax 127, x * 127 / amax = x: every one a tie
    x[0, 64] = 127
    x[-1, 96:128] *= 1e-5
    return x


def random_blocks(qtype, N, K):
    """Raw GGUF bytes of a [N, K] matrix: gguf-py's quantizer where it has one, else random bits with sane
    float16 scales (every bit pattern of a K-quant block is a valid block); MXFP4's every nibble and some of its
    subnormal exponents (0, 1)."""
    if qtype == QT.MXFP4:
        raw = RNG.integers(0, 256, byte_shape((N, K), qtype), dtype=np.uint8).reshape(N, K // 32, 17)
        raw[..., 0] = RNG.choice([0, 1, 2, 100, 120, 127, 128, 135], raw.shape[:2])
        return raw.reshape(N, -1)
    if qtype in LEGACY:
        return gguf.quants.quantize(RNG.standard_normal((N, K)).astype(np.float32), gguf.GGMLQuantizationType(qtype))
    raw = RNG.integers(0, 256, byte_shape((N, K), qtype), dtype=np.uint8).reshape(-1, byte_shape((1, 256), qtype)[1])
    scales = (RNG.random((len(raw), 2)) * 0.01 + 1e-3).astype(np.float16).view(np.uint8)
    for i, name in enumerate(n for n in ("d", "dmin") if n in gt.LAYOUT[qtype]):
        start, end = gt.LAYOUT[qtype][name]
        raw[:, start:end] = scales[:, 2 * i:2 * i + 2]
    return raw.reshape(N, -1)


@pytest.mark.parametrize("qtype", (*LEGACY, *K_QUANTS, QT.MXFP4), ids=lambda t: t.name)
def test_integer_form_dequantizes_as_gguf_py_does(qtype):
    raw = random_blocks(qtype, 6, 512)
    w = gz.int_weights(raw, qtype, (6, 512))
    assert w.codes.dtype == np.int8
    np.testing.assert_array_equal(gz.dequantize(w), dequantize(raw, gguf.GGMLQuantizationType(qtype)))


@pytest.mark.parametrize("qtype", (*LEGACY, *K_QUANTS, QT.MXFP4), ids=lambda t: t.name)
def test_a_product_is_the_dequantized_activations_times_the_dequantized_weights(qtype):
    """ggml's integer-then-scale product is the exact product of the two quantized operands, up to float32
    rounding: checks every scale, minimum and block sum of the integer form."""
    N, K = 24, 512
    raw = random_blocks(qtype, N, K)
    x = activations(4, K)
    got = x @ gn.GgmlMatrix(raw, qtype, (N, K)).T
    vdt = gz.VEC_DOT_TYPE[qtype]
    if vdt == gz.Q8_K:
        q, d, _ = gz.quantize_q8_K(x)
        xq = q.reshape(4, -1, 256) * d[..., None].astype(np.float64)
    else:
        q, _, d = gz.quantize_q8_0(x)
        xq = q.reshape(4, -1, 32) * d[..., None].astype(np.float64)
    want = xq.reshape(4, K) @ dequantize(raw, gguf.GGMLQuantizationType(qtype)).astype(np.float64).T
    if vdt == gz.Q8_1:  # Q8_1's offset term uses s = d * sum(q) rounded to float16, not the exact sum
        _, _, s = gz.quantize_q8_1(x)
        w = gz.int_weights(raw, qtype, (N, K))
        exact_s = (q.reshape(4, -1, 32).sum(-1) * d).astype(np.float64)
        want += (s.astype(np.float64) - exact_s) @ w.m.T.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max())


def test_q8_activation_rules():
    """x86 quantize_row_q8_0/q8_1/q8_K: round half to even, 127 / amax (not 1 / d), float16 d and s (Q8_K: float32
    d, signed max), zero blocks all zero."""
    x = activations(2, 256)
    q, d32, d = gz.quantize_q8_0(x)
    blocks = x.reshape(2, -1, 32)
    assert (q.reshape(2, -1, 32)[0, 0] == 0).all() and d[0, 0] == 0
    ties = blocks[0, 2, 1:]  # k + 0.5: to even (2.5 -> 2), where C's roundf goes away from zero (2.5 -> 3)
    np.testing.assert_array_equal(q.reshape(2, -1, 32)[0, 2, 1:], np.rint(ties))
    assert (q.reshape(2, -1, 32)[0, 2, 1:] != np.trunc(ties + np.copysign(0.5, ties))).sum() == 16  # the odd halves
    np.testing.assert_array_equal(d, d32.astype(np.float16).astype(np.float32))
    _, _, s = gz.quantize_q8_1(x)
    np.testing.assert_array_equal(s, (d32 * q.reshape(2, -1, 32).sum(-1)).astype(np.float16).astype(np.float32))
    qk, dk, bsums = gz.quantize_q8_K(x)
    big = x[1].reshape(-1, 256)[0]
    i = np.abs(big).argmax()  # -50
    assert dk[1, 0] == np.float32(1) / (np.float32(-127) / big[i])
    assert qk[1, i] == -127  # the signed max maps to -127 whatever its sign (Q8_0 maps it to +-127 by its sign)
    np.testing.assert_array_equal(bsums, qk.reshape(2, -1, 16).sum(-1))


@pytest.mark.slow
def test_numba_activation_quantizer_equals_numpy():
    x = activations(5, 512)
    xq, xd, xs = np.empty((5, 512), np.int8), np.empty((16, 5), np.float32), np.empty((16, 5), np.float32)
    gb.quantize_q8(x, xq, xd, xs)
    q, d, s = gz.quantize_q8_1(x)
    np.testing.assert_array_equal(xq, q)
    np.testing.assert_array_equal(xd, d.T)  # block by block, the tokens side by side
    np.testing.assert_array_equal(xs, s.T)


@pytest.mark.slow
@pytest.mark.parametrize("T", [1, 5, 19])
def test_numba_q8_k_quantizer_equals_numpy_in_both_forms(T):
    """Q8_K for the K-quant kernels, serial and parallel: quantize_row_q8_K's rule, and the repacked gemm's first
    T - T % 4 rows in fours (a tie of +2 and -2 goes to +2 there); a block of zeros; rows up to a multiple of 16 are
    zeros."""
    x = RNG.uniform(-1, 1, (T, 768)).astype(np.float32)
    x[:, 10], x[:, 20] = -2.0, 2.0
    x[0, 300] = -9.0
    x[:, 512:] = 0.0
    for four, quantize in itertools.product((0, T - T % 4), (gq.quantize_q8_K_one, gq.quantize_q8_K_many)):
        q, d, bsums = quantize(x, four, T + -T % 16)
        want = gz.quantize_q8_K(x, in_fours=four > 0)
        for got, ref in zip((q, d, bsums), want, strict=True):
            np.testing.assert_array_equal(got[:T], ref)
            assert not got[T:].any()


@pytest.mark.slow
def test_numba_float16_rounding_equals_f16c_on_every_tie():
    halves = np.arange(0, 0x7bff, dtype=np.uint16).view(np.float16).astype(np.float64)
    mid = ((halves[:-1] + halves[1:]) / 2).astype(np.float32)  # ties: to even
    x = np.concatenate([mid, -mid, (RNG.standard_normal(100000) * 10.0 ** RNG.integers(-9, 5, 100000))
                        .astype(np.float32)])
    x = x[np.abs(x) < 65504]
    got = njit(lambda a: np.array([gb._round_f16(v) for v in a]))(x)
    np.testing.assert_array_equal(got, gt.round_f16(x))


def compiles_here(isa):
    """Skip a kernel form whose instructions the CPU lacks (compiling them aborts the process)."""
    if isa != "generic" and ISAS.index(isa) > ISAS.index(gb.ISA):
        pytest.skip(f"this CPU has no {isa.upper()}: the kernels' {isa} form cannot run here")


ISAS = ["generic", "avx2", "vnni"]  # each needs the one before
KERNEL_ISAS = ISAS[1:]  # the whole kernels in the x86 forms; the generic one's sums: the next test


def _form_sums(isa):
    """A kernel (u [64] u8, y [64] i8, out [24] i32): out[:8] = _lanes(u[:32], y[:32]), out[8:] = _dpbusd16(0, u, y,
    pairs_fit=False) in form `isa`."""
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    from refllama.numerics.ir import V32I8, load

    v64 = ir.VectorType(ir.IntType(8), 64)

    @intrinsic
    def sums(typingctx, u, y, out):
        def codegen(context, builder, signature, args):
            u, y, out = args
            lanes = gb._lanes(builder, load(builder, u, V32I8), load(builder, y, V32I8), isa)
            u64, y64 = (builder.bitcast(load(builder, a, v64), gb.V16I32) for a in (u, y))
            wide = gb._dpbusd16(builder, ir.Constant(gb.V16I32, None), u64, y64, isa, False)
            builder.store(lanes, builder.inttoptr(out, gb.V8I32.as_pointer()), align=4)
            builder.store(wide, builder.inttoptr(builder.add(out, ir.Constant(ir.IntType(64), 32)),
                                                 gb.V16I32.as_pointer()), align=4)
            return context.get_dummy_value()

        return types.none(types.int64, types.int64, types.int64), codegen

    return njit(lambda u, y, out: sums(u.ctypes.data, y.ctypes.data, out.ctypes.data))


@pytest.mark.parametrize("isa", ISAS)
def test_every_instruction_form_sums_the_same_products(isa):
    """_lanes (unsigned bytes up to 128, as every caller's) and _dpbusd16 (up to 255: a token's codes plus 128) in
    each form give the exact sums of 4 products, at the extremes of the bytes' ranges."""
    compiles_here(isa)
    kernel = _form_sums(isa)
    for u_top in (128, 255):
        for _ in range(20):
            u = RNG.integers(0, u_top + 1, 64).astype(np.uint8)
            u[:4], y = u_top, RNG.integers(-127, 128, 64).astype(np.int8)
            y[:4] = -127
            out = np.zeros(24, np.int32)
            kernel(u, y, out)
            products = (u.astype(np.int32) * y).reshape(16, 4).sum(axis=1)
            np.testing.assert_array_equal(out[8:], products)
            if u_top == 128:
                np.testing.assert_array_equal(out[:8], products[:8])


@pytest.mark.slow
@pytest.mark.parametrize("isa", KERNEL_ISAS)
@pytest.mark.parametrize("qtype", sorted(gb.BLOCK_BYTES), ids=lambda t: t.name)
@pytest.mark.parametrize("T", [1, 3, 8, 19])
@pytest.mark.parametrize("K", [256, 224])  # MXFP4's one token: 4 blocks at a time, and the last 3 one by one
def test_integer_kernels_equal_the_numpy_emulation_to_the_bit(qtype, isa, T, K):
    """Both kernel forms (8-token tiles and single tokens) against the NumPy lanes, in each instruction set the
    CPU has."""
    compiles_here(isa)
    N = 40 if qtype == QT.MXFP4 else 37  # MXFP4's kernel: its repacked form's (rows a multiple of 8)
    raw = random_blocks(qtype, N, K)
    x = activations(T, K)
    slow = gn.GgmlMatrix(raw, qtype, (N, K))
    want = x @ slow.T
    fast = gb.NumbaGgmlMatrix([raw], qtype, K)
    fast.isa, fast.repacked = isa, slow.repacked
    np.testing.assert_array_equal(x @ fast.T, want)


@pytest.mark.slow
@pytest.mark.parametrize("isa", KERNEL_ISAS)
@pytest.mark.parametrize("qtype, N", [(QT.Q4_K, 40), (QT.Q4_K, 37), (QT.Q5_K, 40), (QT.Q6_K, 40), (QT.Q2_K, 40),
                                     (QT.Q2_K, 37), (QT.Q3_K, 40)],
                         ids=["Q4_K-repacked", "Q4_K", "Q5_K", "Q6_K", "Q2_K-repacked", "Q2_K", "Q3_K"])
# Q4_K and Q2_K are repacked when their rows are 8 k
@pytest.mark.parametrize("T", [1, 3, 5, 8, 14, 19])  # every path: vec_dot, gemv and gemm, tiled, with remainders
def test_k_quant_kernels_on_the_blocks_equal_the_numpy_emulation_to_the_bit(qtype, N, isa, T):
    """Every path of llama.cpp's that the kernels take (GgmlMatrix.matmul, matmul_id), on blocks of every byte value
    (the largest codes, scales and mins, against activations that quantize to +-127: the integer sums at their
    largest), in two parts."""
    compiles_here(isa)
    raw = RNG.integers(0, 256, size=gguf.quant_shape_to_byte_shape((N, 512), qtype), dtype=np.uint8)
    b = raw.reshape(N, 2, -1)
    for name in (n for n in ("d", "dmin") if n in gt.LAYOUT[qtype]):  # finite float16 scales
        start, end = gt.LAYOUT[qtype][name]
        b[..., start:end] = RNG.uniform(-1e-2, 1e-2, b.shape[:2]).astype(np.float16)[..., None].view(np.uint8)
    x = np.where(RNG.random((T, 512)) < 0.5, -1, 1).astype(np.float32) * RNG.uniform(0.5, 1, (T, 512)).astype(
        np.float32)
    want = gn.GgmlMatrix(raw, qtype, (N, 512))
    assert want.repacked == (qtype in (QT.Q4_K, QT.Q2_K) and N == 40)
    fast = gq.NumbaKQuantMatrix([raw[:16], raw[16:]], qtype, 512)
    fast.isa, fast.repacked = isa, want.repacked
    np.testing.assert_array_equal(x @ fast.T, x @ want.T)
    np.testing.assert_array_equal(fast.matmul_id(x), want.matmul_id(x))  # a repacked matrix: the gemv on every row


def test_llama_cpp_paths_differ_in_their_float_steps():
    """The paths' integer sums are equal and their float steps are not: one row's product with one token differs
    in its last bits between vec_dot (8 lanes), the repacked gemv (a block a step) and the tiled kernel (a block a
    step, d_w first); so each must be the one llama.cpp takes (held by test_llamacpp_exact)."""
    raw = random_blocks(QT.Q4_K, 64, 2048)
    x = activations(8, 2048)
    vec_dot = np.concatenate([x[t:t + 1] @ gn.GgmlMatrix(raw, QT.Q4_K, (64, 2048), repack=False).T for t in range(8)])
    tiled = x @ gn.GgmlMatrix(raw, QT.Q4_K, (64, 2048), repack=False).T
    gemv = np.concatenate([x[t:t + 1] @ gn.GgmlMatrix(raw, QT.Q4_K, (64, 2048)).T for t in range(8)])
    gemm = x @ gn.GgmlMatrix(raw, QT.Q4_K, (64, 2048)).T
    for a, b in [(vec_dot, tiled), (vec_dot, gemv), (gemv, tiled), (gemm, gemv)]:
        assert (a != b).any() and np.allclose(a, b, rtol=1e-5, atol=1e-4 * np.abs(a).max())


def test_a_repacked_matrixs_gemm_rows_quantize_ties_to_the_positive_max():
    """x86's ggml_quantize_mat_q8_K_4x8 (the gemm's four rows) takes +amax when a value equals it, where
    quantize_row_q8_K takes the first largest |x|: a block holding -2 before +2 scales by 127 / 2 there (d > 0) and
    by -127 / 2 here (d < 0)."""
    x = RNG.uniform(-1, 1, (5, 256)).astype(np.float32)
    x[:, 10], x[:, 20] = -2.0, 2.0
    q, d, _ = gz.quantize_q8_K(x)
    q4, d4, _ = gz.quantize_q8_K(x, in_fours=True)
    assert (q[:, 10] == -127).all() and (q[:, 20] == 127).all() and (d > 0).all()
    assert (q4[:4, 10] == 127).all() and (q4[:4, 20] == -127).all() and (d4[:4] < 0).all()
    np.testing.assert_array_equal(q4[4], q[4])  # the fifth row goes through the gemv: ggml's own quantizer


@pytest.mark.slow
def test_the_kernel_form_follows_the_host_cpu(monkeypatch):
    """vpdpbusd only where LLVM reports AVX-512 VNNI with 256-bit vectors, vpmaddubsw where it reports AVX2:
    compiling them elsewhere aborts. Numba told to compile for another CPU: that CPU's features."""
    monkeypatch.setattr(numba.config, "CPU_FEATURES", None)  # the host's: as Numba takes them unless told
    for features, isa in (({"avx2": True, "avx512vnni": False}, "avx2"), ({"sse4.2": True}, "generic"),
                          ({"avx2": True, "avx512vnni": True, "avx512vl": True}, "vnni")):
        monkeypatch.setattr(llvmlite.binding, "get_host_cpu_features", lambda f=features: f)
        assert gb.kernel_isa() == isa
    for name, features, isa in (("haswell", "+avx2,+fma,+f16c", "avx2"), ("generic", "-avx2,+sse4.2", "generic"),
                                ("skylake-avx512", "+avx2,+avx512f,+avx512vl,+avx512vnni", "vnni"),
                                ("haswell", None, "vnni")):  # no features: Numba takes the host's
        monkeypatch.setattr(numba.config, "CPU_NAME", name)
        monkeypatch.setattr(numba.config, "CPU_FEATURES", features)
        assert gb.kernel_isa() == isa


@pytest.mark.slow
def test_expf_is_within_a_few_ulp_of_exp_and_kernels_agree():
    x = np.concatenate([np.linspace(-100, 80, 20001, dtype=np.float32), [-np.inf, 0, -0.5, 88.7]]).astype(np.float32)
    got = gf.expf(x)
    ref = np.exp(x.astype(np.float64))
    finite = np.isfinite(ref) & (ref > 1e-37) & (ref < 3e38)
    ulp = np.spacing(ref[finite].astype(np.float32)).astype(np.float64)
    assert (np.abs(got[finite] - ref[finite]) <= 2.5 * ulp).all()  # 2.14 ulp at worst on this grid
    assert got[x == -np.inf] == 0
    np.testing.assert_array_equal(njit(lambda a: np.array([gk.expf(v) for v in a], np.float32))(x), got)


@pytest.mark.slow
@pytest.mark.parametrize("path", EMULATED["numba"])
@pytest.mark.parametrize("T, S, HD", [(1, 37, 64), (1, 200, 96), (1, 130, 128), (1, 9, 80), (1, 5, 40), (5, 5, 64),
                                      (7, 130, 96), (3, 11, 40)])
def test_attention_kernels_equal_the_numpy_emulation_to_the_bit(T, S, HD, path):
    """One token (vec_dot_f16's 4 x w lanes, HD % 4w leftovers in float64; HD % 4w == 0 in IR) and a batch
    (tinyBLAS's w lanes), w 16 on the AVX-512 path and 8 on AVX2's. K and V are the first S rows of a longer cache,
    as the forward passes them. SwiGLU over whole vectors and a rest (50 = 3 x 16 + 2 = 6 x 8 + 2)."""
    H, KVH = 6, 2
    q = RNG.standard_normal((T, H, HD)).astype(np.float32)
    k, v = (gt.round_f16(RNG.standard_normal((KVH, S + 9, HD)).astype(np.float32))[:, :S] for _ in range(2))
    kq = gf.attention_scores(q, k, path)
    np.testing.assert_array_equal(gk.attention_scores(q, k, path), kq)
    mask = refllama.layers.causal_mask(S - T, T, S, np)
    p = gf.attention_weights(kq, mask, 0.125, path=path)
    np.testing.assert_array_equal(gk.attention_weights(kq, mask, 0.125, path=path), p)
    np.testing.assert_allclose(p.sum(-1), 1, rtol=1e-6)
    sinks = RNG.uniform(2, 4, H).astype(np.float32)  # gpt-oss's: a logit a head in the denominator, taking weight
    with_sinks = gf.attention_weights(kq, mask, 0.125, sinks, path=path)
    np.testing.assert_array_equal(gk.attention_weights(kq, mask, 0.125, sinks, path=path), with_sinks)
    np.testing.assert_allclose(with_sinks, refllama.layers.attention_weights(kq, mask, 0.125, sinks), rtol=1e-5,
                               atol=1e-7)
    assert (with_sinks.sum(-1) < p.sum(-1)).all()
    np.testing.assert_array_equal(gk.attention_mix(p, v, path), gf.attention_mix(p, v, path))
    gate, up = (RNG.standard_normal((T, 50)) * 4).astype(np.float32), RNG.standard_normal((T, 50)).astype(np.float32)
    np.testing.assert_array_equal(gk.swiglu(gate, up, path), gf.swiglu(gate, up, path))


def test_f16_sums_follow_ggml_order_not_float64():
    """Sums of float16 products in ggml's lane order differ from the exactly rounded sum: a check that the order is
    modelled, not float64 in disguise (which would miss llama.cpp's last bits)."""
    a = gt.round_f16(RNG.standard_normal((2000, 64)).astype(np.float32))
    b = gt.round_f16(RNG.standard_normal((2000, 64)).astype(np.float32))
    exact = (a.astype(np.float64) * b).sum(-1).astype(np.float32)
    assert (gf.f16_dots(a, b, 2, False) != exact).any()
    assert (gf.f16_dots(a, b, 2, False) != gf.f16_dots(a, b, 1, False)).any()


@pytest.mark.slow
def test_fused_products_equal_separate_ones():
    """q/k/v (gate/up) joined into one matrix give each part the columns its own product gives."""
    parts = [QuantMatrix([random_blocks(QT.Q4_1, n, 256)], QT.Q4_1, 256) for n in (64, 32, 32)]
    x = activations(3, 256)
    want = [x @ m.T for m in parts]
    fused = Fused(concat_blocks(parts), [64, 32, 32]).parts()
    for m, w in zip(fused, want, strict=True):
        np.testing.assert_array_equal(x @ m.T, w)
    y = activations(3, 256)
    np.testing.assert_array_equal(y @ fused[1].T, y @ parts[1].T)  # a new input is multiplied afresh
    raw = [random_blocks(QT.Q8_0, n, 256) for n in (16, 8)]
    joined = concat_blocks([gb.NumbaGgmlMatrix([r], QT.Q8_0, 256) for r in raw])
    np.testing.assert_array_equal(x @ joined.T, np.concatenate([x @ gn.GgmlMatrix(r, QT.Q8_0, (len(r), 256)).T
                                                                 for r in raw], axis=1))


def test_numerics_errors_name_the_problem(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(refllama.RefllamaError, match="numerics 'ggml' .* GGUF"):
        refllama.load(tmp_path, numerics="ggml")
    with pytest.raises(refllama.RefllamaError, match="unknown numerics 'bf16'"):
        refllama.load(numerics="bf16")


@pytest.mark.slow
def test_ggml_models_on_both_backends_agree_to_the_bit(model):
    """The readable emulation and the fast kernels: the same logits for a prefill and three decode steps."""
    ids = [1, 504, 3575, 282, 4649, 314]
    out = []
    for backend in ("numpy", "numba"):
        m = refllama.load(model.path, backend=backend, numerics="ggml", n_ctx=64)
        logits = [m.forward(ids, 0)]
        for k in range(3):
            logits.append(m.forward([int(np.argmax(logits[-1][-1]))], len(ids) + k))
        out.append(np.concatenate(logits))
    np.testing.assert_array_equal(out[0], out[1])
    assert math.isfinite(float(out[0].max()))


@pytest.mark.slow
@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("qtype", [QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q5_0], ids=lambda t: t.name)
def test_integer_kernels_of_more_types_equal_the_numpy_emulation_to_the_bit(qtype, T):
    raw = RNG.integers(0, 0x3C, size=gguf.quant_shape_to_byte_shape((40, 512), qtype), dtype=np.uint8)
    x = RNG.standard_normal((T, 512)).astype(np.float32)
    ref = gn.GgmlMatrix(raw, qtype, (40, 512))
    fast = gk.GgmlNumbaPlacement()(refllama.formats.ggml_types.QuantizedTensor(raw, qtype, (40, 512)))
    assert type(fast).__name__ == ("NumbaGgmlMatrix" if qtype == QT.Q5_0 else "NumbaKQuantMatrix")
    np.testing.assert_array_equal(x @ fast.T, x @ ref.T)
    np.testing.assert_array_equal(fast[[0, 3, 39, 3]], ref[[0, 3, 39, 3]])


@pytest.mark.slow
@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q8_0, QT.MXFP4, *gq.K_QUANTS], ids=lambda t: t.name)
def test_no_kernel_mixes_sse4a_into_its_vector_code(qtype):
    """LLVM lowers some constant byte shuffles with SSE4a's extrq/insertq where the CPU has it (AMD's); those
    legacy-SSE instructions beside 256-bit code made Q4_K's one-token kernel 4.7x slower on a Zen 3. Every block
    kernel this host compiles (one token, a few, a batch; mul_mat_id) holds none of them."""
    if "sse4a" not in refllama.numerics.ir.compile_features():
        pytest.skip("this CPU has no SSE4a: LLVM emits no extrq/insertq here")
    raw = RNG.integers(0, 0x3C, size=gguf.quant_shape_to_byte_shape((40, 512), qtype), dtype=np.uint8)
    fast = gk.GgmlNumbaPlacement()(refllama.formats.ggml_types.QuantizedTensor(raw, qtype, (40, 512)))
    for T in (1, 3, 20):
        x = RNG.standard_normal((T, 512)).astype(np.float32)
        x @ fast.T
        if hasattr(fast, "matmul_id"):  # a repacked K-quant form of its own; the block types: x @ w.T
            fast.matmul_id(x)
    kernels = gq.KERNELS if qtype in gq.K_QUANTS else gb.KERNELS
    kernel = kernels[(qtype, fast.isa, fast.repacked)]
    options = {k: v for k, v in kernel.targetoptions.items() if k in ("parallel", "fastmath", "nogil")}
    fresh = numba.njit(**options)(kernel.py_func)  # compiled anew: Numba returns no assembly for cached code
    for sig in kernel.signatures:
        fresh.compile(sig)
        asm = fresh.inspect_asm(sig)
        assert "ret" in asm  # real assembly
        assert "extrq" not in asm and "insertq" not in asm, f"{qtype.name}'s kernel: extrq/insertq in its code"


@pytest.mark.slow
@pytest.mark.parametrize("path", EMULATED["numba"])
@pytest.mark.parametrize("T,N,K", [(1, 128, 2048), (1, 8, 200), (1, 8, 96), (3, 8, 64), (2, 6, 48), (5, 4, 100),
                                   (3, 4, 40)])
def test_numba_f32_products_equal_numpy_in_every_form(T, N, K, path):
    """A float32 matrix's products (a router's, an F32 file's) in Numba: tinyBLAS's w lanes for a batch whose
    shapes it takes, else vec_dot_f32's 4 w lanes and the leftovers one by one (w 16, AVX2's 8), bit-equal to the
    NumPy form."""
    x, w = RNG.standard_normal((T, K)).astype(np.float32), RNG.standard_normal((N, K)).astype(np.float32)
    np.testing.assert_array_equal(x @ gk.NumbaF32Matrix(w, path).T, x @ gn.F32Matrix(w, path).T)


@pytest.mark.slow
@pytest.mark.parametrize("make", [
    lambda r, q: QuantMatrix([r], q, 256),
    lambda r, q: gq.NumbaKQuantMatrix([r], q, 256) if q in gq.K_QUANTS else gb.NumbaGgmlMatrix([r], q, 256),
], ids=["float32", "ggml"])
@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q8_0, QT.Q4_0, QT.MXFP4])
@pytest.mark.parametrize("repack", [False, True])
def test_a_tokens_experts_joined_give_each_expert_its_own_product(make, qtype, repack):
    """mul_mat_id for one token: its K experts' matrices joined into one kernel call, by its one row (gate, up) and
    by each slot's own row (down: matmul_parts), give each slot the product its own expert's matrix gives alone,
    bit for bit, in both forms of numerics ggml (repacked: mul_mat_id's gemv)."""
    experts = []
    for _ in range(6):
        m = make(random_blocks(qtype, 16, 256), qtype)
        m.repacked = repack and gn.repacked(qtype, m.shape) is not None
        experts.append(m)
    ids = np.array([[4, 1, 5]])
    product = gn.id_product if hasattr(experts[0], "isa") else linear
    x = activations(1, 256)
    rows = activations(3, 256)[None]  # [1, K, in]
    assert experts[0].join([experts[e] for e in ids[0]]).in_quads()  # the down products take matmul_parts
    for inputs in (x, rows):
        got = mul_mat_id(inputs, experts, ids, product=product)
        want = [product((inputs[:, k] if inputs.ndim == 3 else inputs), experts[e]) for k, e in enumerate(ids[0])]
        np.testing.assert_array_equal(got, np.stack(want, axis=1))
    # a layer's gate and up experts (fuse_layer: Stacks sharing a Paired): both products of one call of the kernel
    # on the 2K experts joined, each its own experts' rows; every head's matrices (a Stack's whole) as each its own
    lw = {"ffn_gate_exps": tuple(experts[:3]), "ffn_up_exps": tuple(experts[3:])}
    fuse_layer(lw, concat_blocks)
    gate, up = lw["ffn_gate_exps"], lw["ffn_up_exps"]
    assert gate.pair is up.pair is not None
    ids = np.array([[2, 0]])
    got_gate = mul_mat_id(x, gate, ids, product=product)
    assert gate.pair.left == 1  # the up half kept for the second product
    got_up = mul_mat_id(x, up, ids, product=product)
    assert gate.pair.out is None
    for got, mats in ((got_gate, gate), (got_up, up)):
        np.testing.assert_array_equal(got, np.stack([product(x, mats[e]) for e in ids[0]], axis=1))
    every = np.arange(3)[None]
    np.testing.assert_array_equal(mul_mat_id(rows, gate, every, product=product),
                                  np.stack([product(rows[:, k], gate[k]) for k in range(3)], axis=1))
    assert "whole" in vars(gate)  # made once, kept for the next step


@pytest.mark.slow
@pytest.mark.parametrize("path", EMULATED["numba"])
@pytest.mark.parametrize("n", [128, 60, 8, 5])
def test_numba_router_softmax_equals_numpy(n, path):
    """A router's softmax in Numba: ggml_v_expf on whole vectors (16 lanes, AVX2's 8), the C library's expf on the
    rest, the sum in float64 vector by vector, bit-equal to the NumPy form (60 experts: Qwen2-MoE's 12 left over)."""
    x = (RNG.standard_normal((5, n)) * 4).astype(np.float32)
    np.testing.assert_array_equal(gk.router_softmax(x, path), gf.softmax(x, path))


@pytest.mark.slow  # Numba's kernels
@pytest.mark.parametrize("path", ["avx512-vnni", "avx2"])
def test_float_matrices_on_numba_are_the_numpy_forms(path):
    """F16 and F32 matrices on numba (NumbaF16Matrix: the attention kernels' float16 sums; NumbaF32Matrix) equal the
    NumPy forms bit for bit, as a batch (tinyBLAS where the shape takes it) and as mul_mat_id's rows (ggml_vec_dot a
    row at a time), at K whole vectors or not."""
    rng = np.random.default_rng(0)
    for K, T in itertools.product((40, 72, 80, 256), (1, 3, 12)):
        x = rng.standard_normal((T, K)).astype(np.float32)
        w16, w32 = rng.standard_normal((64, K)).astype(np.float16), rng.standard_normal((64, K)).astype(np.float32)
        for mine, theirs in ((gk.NumbaF16Matrix(w16, np, path), gn.F16Matrix(w16, np, path)),
                             (gk.NumbaF32Matrix(w32, path), gn.F32Matrix(w32, path))):
            np.testing.assert_array_equal(mine.matmul(x), theirs.matmul(x))
            np.testing.assert_array_equal(mine.matmul_id(x), theirs.matmul_id(x))
