"""llama.cpp's CPU paths: which one a host's llama.cpp takes, which one numerics "ggml" computes, and every place
that says so (run's timing line, the dump manifest, compare's notes)."""

import json
from pathlib import Path

import numpy as np
import pytest

import refllama
from refllama.check.compare import compare
from refllama.check.dump import Dump
from refllama.numerics import cpu_paths
from refllama.numerics import ggml_float as gf
from refllama.numerics import ggml_tables as gt

RNG = np.random.default_rng(20261126)
DATA = Path(__file__).parent / "data"

X86 = {"avx", "avx2", "fma", "f16c"}
AVX512 = X86 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
SYSTEM_INFO = {  # llama_print_system_info() of the two wheels in ../shared/wheels, and of an ARM build
    "avx512-vnni": "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
                   "AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ",
    "avx2": "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | "
            "OPENMP = 1 | REPACK = 1 | ",
    "neon-i8mm": "CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | MATMUL_INT8 = 1 | DOTPROD = 1 | REPACK = 1 | ",
    "neon-dotprod": "CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | REPACK = 1 | ",
}


@pytest.mark.parametrize("features, machine, path", [
    (AVX512 | {"avx512vnni"}, "x86_64", "avx512-vnni"),
    (AVX512, "x86_64", "avx512"),
    (X86, "x86_64", "avx2"),  # AMD Zen 2/3, Intel's client CPUs since Alder Lake
    ({"avx", "sse4.2"}, "x86_64", None),
    ({"neon", "dotprod", "fullfp16", "i8mm"}, "aarch64", "neon-i8mm"),  # Apple M2 and up, Graviton 3
    ({"neon", "dotprod", "fullfp16"}, "arm64", "neon-dotprod"),  # Apple M1, Graviton 2
])
def test_the_host_path_is_the_most_capable_one_it_can_run(features, machine, path):
    assert cpu_paths.host_path(features, machine) == path


@pytest.mark.parametrize("path", list(SYSTEM_INFO))
def test_a_llamacpp_builds_path_is_read_from_its_system_info(path):
    assert cpu_paths.llamacpp_path(SYSTEM_INFO[path]) == path


def test_the_host_path_where_reproduced_else_the_nearest_with_a_notice(monkeypatch):
    monkeypatch.setattr(cpu_paths, "host_path", lambda: "avx2")
    assert cpu_paths.choose(None, "numpy") == cpu_paths.choose(None, "numba") == ("avx2", None)
    assert cpu_paths.choose(None, "numpy", lambda: pytest.fail("x86 paths need no type list")) == ("avx2", None)
    path, notice = cpu_paths.choose(None, "cupy")
    assert path == "avx512-vnni" and "takes the avx2 path" in notice and "(it does on numpy, numba)" in notice
    monkeypatch.setattr(cpu_paths, "host_path", lambda: "avx512")
    assert cpu_paths.choose()[0] == "avx512-vnni"
    monkeypatch.setattr(cpu_paths, "host_path", lambda: "neon-dotprod")
    assert cpu_paths.choose(None, "numpy", lambda: {"Q8_0", "F32"}) == ("neon-dotprod", None)
    path, notice = cpu_paths.choose(None, "numpy", lambda: {"Q5_1", "Q4_K", "F32"})  # a path for some types only
    assert path == "avx512-vnni"
    assert "Q6_K, Q8_0 matrices only (this model has Q5_1)" in notice
    path, notice = cpu_paths.choose(None, "numba")
    assert path == "avx512-vnni" and "neon-dotprod path, which numerics 'ggml' does not reproduce on numba" in notice


@pytest.mark.parametrize("kwargs, message", [
    (dict(numerics="ggml", cpu_path="avx2", backend="cupy"),
     "cpu path 'avx2' is not one numerics 'ggml' reproduces on cupy .* and avx2 on numpy, numba"),
    (dict(numerics="ggml", cpu_path="neon-i8mm", backend="numba"),
     "'neon-i8mm' is not one numerics 'ggml' reproduces on numba .* and neon-i8mm on numpy"),

    (dict(numerics="ggml", cpu_path="sse"), "unknown cpu path 'sse'"),
    (dict(cpu_path="avx512-vnni"), "goes with numerics 'ggml'"),
])
def test_a_path_that_cannot_be_computed_is_refused_by_name(kwargs, message):
    with pytest.raises(refllama.RefllamaError, match=message):
        refllama.load(**kwargs)


@pytest.mark.slow  # a dump and a compare on each path
def test_the_dump_and_compare_say_which_path(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cpu_paths, "host_path", lambda: "neon-dotprod")
    m = refllama.load(numerics="ggml", n_ctx=32)  # SmolLM2: Q4_1 and Q8_0, both reproduced on ARM's path
    assert "cpu path" not in capsys.readouterr().err
    ids = m.tokenize("The capital of France is")
    d = m.dump(ids, tmp_path / "mine")
    assert Dump(d).cpu_path == m.cpu_path == "neon-dotprod"
    assert "cpu path: neon-dotprod (both)" in compare(d, d).notes
    other = tmp_path / "ref"
    (other / "manifest.json").parent.mkdir()
    for f in d.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((other / "manifest.json").read_text())
    (other / "manifest.json").write_text(json.dumps({**manifest, "cpu_path": "avx2"}))
    assert "cpu path: MINE neon-dotprod, REF avx2" in compare(d, other).notes
    (other / "manifest.json").write_text(json.dumps({**manifest, "cpu_path": "avx3"}))
    with pytest.raises(refllama.RefllamaError, match="'cpu_path' must be one of avx512-vnni, .*got 'avx3'"):
        Dump(other)


def test_the_avx2_path_differs_from_avx512s_where_llamacpps_builds_do():
    """The two paths' float steps on the same values: AVX2's expf ends differently (agreeing with AVX-512's to 1 ulp,
    finite up to 88.7 and 0 below -103 as the true exp), its vec_dot reduces 8 lanes by two hadds; each path's
    kq sums differ in their last bits."""
    x = np.linspace(-103, 88.7, 200001, dtype=np.float32)
    a, b = gf.expf(x), gf.expf_avx2(x)
    assert (a != b).any() and np.all(np.abs(a.view(np.int32) - b.view(np.int32)) <= 1)
    assert np.isfinite(b).all() and gf.expf_avx2(np.float32([-110, 100])).tolist() == [0.0, np.inf]
    q = gt.round_f16(RNG.standard_normal((50, 64)).astype(np.float32))
    k = gt.round_f16(RNG.standard_normal((50, 64)).astype(np.float32))
    one = {p: gf.f16_dots(q, k, 1, False, p) for p in gf.LANES}
    assert (one["avx2"] != one["avx512-vnni"]).any()


def test_a_product_the_arm_paths_do_not_reproduce_is_refused_by_name():
    """i8mm's two-row K-quant vec_dot (a Q4_K or Q6_K matrix not repacked, an even batch) is not reproduced: the
    forward says so instead of computing another arithmetic; an odd batch takes the one-row form, reproduced."""
    m = refllama.load(DATA / "gguf-qwen2-kquant" / "qwen2-q4_k_m.gguf", numerics="ggml", cpu_path="neon-i8mm",
                      repack=False, n_ctx=64)
    with pytest.raises(refllama.RefllamaError, match="Q._K matrix not repacked, 8 tokens on the neon-i8mm path: its "
                                                     "two-row vec_dot"):
        m.logits(list(range(1, 9)))
    assert np.isfinite(m.logits(list(range(1, 8)))).all()
