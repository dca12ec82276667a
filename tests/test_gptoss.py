"""gpt-oss in the form it ships: its MXFP4 experts (llama.cpp's own quantizer wrote the tiny file) multiplied as
llama.cpp multiplies them, to the bit, on both x86 paths, repacked or not, NumPy and Numba; kept in their blocks by
the float32 backends; and the references' YaRN disagreement (the released config's `truncate: false`, which
llama.cpp cannot compute), which refllama follows from the config it reads and compare names."""

import json
import shutil

import gguf
import numpy as np
import pytest
from families import GGUF
from gguf.quants import dequantize
from tiers import param

import refllama
from refllama.check.dump import Dump
from refllama.check.references import notes
from refllama.errors import RefllamaError
from refllama.formats.ggml_types import GGMLType as QT
from refllama.formats.gguf_loader import GGUFFile
from refllama.loader import load_hf
from refllama.numerics.matrices import FileMatrix, FilePlacement
from refllama.numerics.quant import QuantMatrix
from refllama.xp import Placement

FAMILY = GGUF["gptoss"]
N_CTX = 256
KEYS = {"avx512-vnni": "llamacpp_logits_q8_0_f16kv_mxfp4", "avx2": "llamacpp_logits_q8_0_f16kv_avx2_mxfp4"}
ODD_KEYS = {"avx512-vnni": "llamacpp_logits_mxfp4_f16kv", "avx2": "llamacpp_logits_mxfp4_f16kv_avx2"}  # d96's


def ref():
    return np.load(FAMILY.dir / "reference.npz")


def rel(got, want):
    return float(np.abs(np.asarray(got) - want).max() / np.ptp(want))


@pytest.mark.parametrize("repack", [True, False], ids=["repacked", "vec_dot"])
@pytest.mark.parametrize("path", list(KEYS))
@pytest.mark.parametrize("backend", ["numpy", param("numba", fast=False)])
def test_mxfp4_logits_in_ggml_numerics_are_llamacpps(backend, path, repack):
    """The experts' MXFP4 x Q8_0 products as llama.cpp computes them: repacked to mxfp4_8x8_q8_0 (its default; rows
    a multiple of 8) or its vec_dot (--no-repack), on the AVX-512 and AVX2 builds' paths: the same logits, bit for
    bit (Numba: its IR kernel for the repacked form)."""
    r = ref()
    m = refllama.load(FAMILY.gguf("mxfp4"), n_ctx=N_CTX, backend=backend, numerics="ggml", cpu_path=path,
                      repack=repack)
    key = KEYS[path] + ("" if repack else "_norepack")
    np.testing.assert_array_equal(m.logits(r["token_ids"].tolist()), r[key])


@pytest.mark.parametrize("repack", [True, False], ids=["repacked", "vec_dot"])
@pytest.mark.parametrize("path", list(KEYS))
@pytest.mark.parametrize("backend", ["numpy", param("numba", fast=False)])
def test_an_odd_number_of_blocks_a_row_is_llamacpps(backend, path, repack):
    """The tiny gpt-oss 96 wide (3 MXFP4 blocks a row): the vec_dot's last block, outside its pairs, added by a
    fused multiply-add (GCC contracts the scalar loop) after hsum_float_8; the repacked form's blocks one by one."""
    r = np.load(FAMILY.dir / "gptoss-d96.npz")
    m = refllama.load(FAMILY.dir / "gptoss-d96-mxfp4.gguf", n_ctx=N_CTX, backend=backend, numerics="ggml",
                      cpu_path=path, repack=repack)
    key = ODD_KEYS[path] + ("" if repack else "_norepack")
    np.testing.assert_array_equal(m.logits(r["token_ids"].tolist()), r[key])


@pytest.mark.parametrize("path", list(KEYS))
def test_mxfp4_greedy_tokens_are_llamacpps(path):
    """Prefill, then one token a step through the float16 cache, as llama.cpp's greedy continuation runs."""
    r = ref()
    ids = r["token_ids"].tolist()
    m = refllama.load(FAMILY.gguf("mxfp4"), n_ctx=N_CTX, numerics="ggml", cpu_path=path)
    want = r[KEYS[path] + "_greedy"].tolist()
    out = [int(m.forward(ids, 0)[-1].argmax())]
    for k in range(len(want) - 1):
        out.append(int(m.forward(out[-1:], len(ids) + k)[-1].argmax()))
    assert out == want


@pytest.mark.parametrize("backend", ["numpy", param("numba", fast=False)])
def test_float32_backends_multiply_mxfp4_as_gguf_py_dequantizes_it(backend):
    """numerics float32 on the MXFP4 file: numba multiplies the experts from the file's blocks (its MXFP4 kernel),
    numpy from float32 (a model this small is converted at load; a large one's blocks are converted a chunk at a
    time, FileMatrix, as gguf-py dequantizes them), and the two agree to float32. Against llama.cpp's logits on the
    file they differ by llama.cpp's Q8_0 rounding of the activations, which flips some near ties of the router."""
    r = ref()
    m = refllama.load(FAMILY.gguf("mxfp4"), n_ctx=N_CTX, backend=backend)
    if backend == "numba":
        assert isinstance(m.weights["layers"][0]["ffn_gate_exps"][0], QuantMatrix)
    logits = m.logits(r["token_ids"].tolist())
    want = r[KEYS["avx512-vnni"]]
    assert rel(logits, want) < 1e-1 and (logits.argmax(-1) == want.argmax(-1)).mean() >= 0.9
    float32 = refllama.load(FAMILY.gguf("mxfp4"), n_ctx=N_CTX, backend="numpy").logits(r["token_ids"].tolist())
    assert rel(logits, float32) < 1e-5


def test_a_large_models_mxfp4_matrix_stays_in_the_file():
    """The numpy placement of a model too large for float32 keeps an MXFP4 matrix in its blocks (FileMatrix), its
    product that of gguf-py's dequantized rows."""
    t = GGUFFile(FAMILY.gguf("mxfp4")).tensor("blk.0.ffn_up_exps.weight", (6, 64, 64), keep_quantized={QT.MXFP4})
    assert t.qtype == QT.MXFP4
    first = t.split([64] * 6)[0]
    w = FilePlacement(in_file=True)(first)
    assert isinstance(w, FileMatrix)
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    want = x @ dequantize(np.asarray(first.raw), gguf.GGMLQuantizationType.MXFP4).reshape(64, 64).T
    np.testing.assert_allclose(x @ w.T, want, rtol=1e-6, atol=1e-6)


def untruncated(tmp_path):  # the tiny model's HF directory with the released config's `truncate: false`
    d = tmp_path / "hf"
    shutil.copytree(FAMILY.dir / "hf-model", d)
    config = json.loads((d / "config.json").read_text())
    config["rope_parameters"]["truncate"] = False
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_yarn_follows_the_config_and_compare_names_the_disagreement(tmp_path):
    """transformers computes YaRN's ramp untruncated where the config says so (gpt-oss's released one); llama.cpp
    always truncates it (its GGUF has no field for it). refllama reads the HF directory as transformers does (within
    1e-5 of its logits), the GGUF file as llama.cpp does; the two references then differ far past float32, and
    compare's reference note says why."""
    r = ref()
    ids = r["token_ids"].tolist()
    hf = refllama.load(untruncated(tmp_path), n_ctx=N_CTX)
    assert hf.config.rope_yarn == (32.0, 1.0, False)
    assert refllama.load(FAMILY.gguf(), n_ctx=N_CTX).config.rope_yarn == (32.0, 1.0, True)
    assert rel(hf.logits(ids), r["hf_logits_untruncated"]) < 1e-5
    assert rel(r["hf_logits_untruncated"], r["llamacpp_logits_f32"]) > 1e-4  # a real disagreement
    said = notes(hf, Dump(FAMILY.dir / "hf"), Dump(FAMILY.dir / "llamacpp-f32"), [])
    assert any("always truncated" in line for line in said), said


def test_a_config_with_other_swiglu_constants_is_named_as_llamacpps_difference(tmp_path):
    """llama.cpp's graph fixes the clamped SwiGLU's alpha (1.702) and limit (7); a config with others is a model
    llama.cpp cannot compute, and compare says so."""
    d = tmp_path / "hf"
    shutil.copytree(FAMILY.dir / "hf-model", d)
    config = json.loads((d / "config.json").read_text())
    assert (config["swiglu_alpha"], config["swiglu_limit"]) == (1.702, 7.0)
    config["swiglu_limit"] = 5.0
    (d / "config.json").write_text(json.dumps(config))
    m = refllama.load(d, n_ctx=N_CTX)
    assert m.config.oai_swiglu == (1.702, 5.0)
    said = notes(m, Dump(FAMILY.dir / "hf"), Dump(FAMILY.dir / "llamacpp-f32"), [])
    assert any("limit 5" in line for line in said), said


def test_the_tiny_model_exercises_what_gpt_oss_adds():
    """So that the checks above can fail: the sinks take weight from the keys, some gates and ups pass the clamp,
    the window hides keys on the even layers, the tokens choose different experts."""
    r = ref()
    m = refllama.load(FAMILY.gguf(), n_ctx=N_CTX)
    with refllama.trace(m) as t:
        m.logits(r["token_ids"].tolist())
    cfg = m.config
    assert cfg.swa_layers == (True, False, True, False) and cfg.sliding_window == 4
    for i in range(cfg.n_layer):
        assert t[f"kq_soft_max-{i}"].sum(-1).mean() < 0.99  # the sinks' share
        assert (t[f"ffn_moe_gate_biased-{i}"] > 7).any() and (np.abs(t[f"ffn_moe_up_biased-{i}"]) > 7).any()
        assert len(set(t[f"ffn_moe_topk-{i}"][:, 0].tolist())) > 2
    assert (t["kq_soft_max-0"][:, -1, :-4] == 0).all() and (t["kq_soft_max-1"][:, -1, :-4] > 0).all()


def test_the_released_checkpoints_packed_experts_are_read_as_llamacpps_converter_repacks_them():
    """gpt-oss's released HF checkpoints hold their experts as MXFP4 blocks and scales (quantization_config
    "mxfp4", HF's nibble order): read in their blocks, the bytes llama.cpp's converter writes for them (its GGUF of
    the same directory) and the float32 logits of that GGUF to the bit; numba multiplies them in their blocks."""
    packed, converted = FAMILY.dir / "hf-mxfp4", FAMILY.gguf("hf-mxfp4")

    class Stored(Placement):  # the tensors as the loader reads them
        keep = frozenset({QT.MXFP4})

        def __call__(self, a):
            return a

    experts = load_hf(packed, Stored(np)).weights["layers"]
    g = GGUFFile(converted)
    for i, lw in enumerate(experts):
        for key in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            theirs = g.tensor(f"blk.{i}.{key}.weight", (6, 64, 64), keep_quantized={QT.MXFP4})
            assert theirs.qtype == QT.MXFP4 and all(e.qtype == QT.MXFP4 for e in lw[key])
            np.testing.assert_array_equal(np.concatenate([np.asarray(e.raw) for e in lw[key]]),
                                          np.asarray(theirs.raw).reshape(6 * 64, -1))
    ids = [1, 5, 9, 2, 7, 3, 11, 4]
    want = refllama.load(converted, n_ctx=N_CTX).logits(ids)
    np.testing.assert_array_equal(refllama.load(packed, n_ctx=N_CTX).logits(ids), want)
    m = refllama.load(packed, n_ctx=N_CTX, backend="numba")
    assert isinstance(m.weights["layers"][0]["ffn_up_exps"][0], QuantMatrix)


def test_another_quantizers_packed_checkpoint_is_refused_by_name(tmp_path):
    """A quantization_config refllama does not read (bitsandbytes', GPTQ's): one line naming it."""
    d = tmp_path / "hf"
    shutil.copytree(FAMILY.dir / "hf-model", d)
    config = json.loads((d / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(RefllamaError, match="unsupported quantization_config 'bitsandbytes'"):
        refllama.load(d)
