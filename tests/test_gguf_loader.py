"""GGUF loading: config from metadata, every supported tensor type, and a clear error for every bad file."""

import subprocess
import sys

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from tiny_gguf import TINY, TINY_TOKENS, tiny_metadata, tiny_tensors, write_gguf

import refllama
from refllama.formats.ggml_types import BLOCK_SIZES, SUPPORTED_TYPES, GGMLType, byte_shape
from refllama.loader import load_gguf


def test_default_model_config_comes_from_metadata(model):
    c = model.config
    assert (c.arch, c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim) == ("llama", 30, 576, 9, 3, 64)
    assert (c.n_ff, c.vocab_size, c.n_ctx_train, c.rope_base, c.rope_dim) == (1536, 49152, 8192, 100000.0, 64)
    assert c.rms_eps == pytest.approx(1e-5) and c.tied_output  # SmolLM2 has no output.weight
    assert model.weights["output"] is model.weights["token_embd"]


@pytest.mark.parametrize("qtype", sorted(SUPPORTED_TYPES, key=lambda t: t.value), ids=lambda t: t.name)
def test_every_supported_type_loads_as_gguf_dequantizes_it(tmp_path, qtype):
    tensors = tiny_tensors(qtype, seed=int(qtype))
    path = write_gguf(tmp_path / f"tiny-{qtype.name}.gguf", tiny_metadata(), tensors)
    cfg, w, *_ = load_gguf(path)
    raw, t = tensors["blk.1.attn_q.weight"]
    expected = gguf.quants.dequantize(raw, t) if t not in (QT.F32, QT.F16) else raw.astype(np.float32)
    np.testing.assert_array_equal(w["layers"][1]["attn_q"], expected)
    assert w["layers"][1]["attn_q"].dtype == np.float32 and w["layers"][1]["attn_q"].shape == (256, 256)
    raw_emb, t_emb = tensors["token_embd.weight"]
    quantized = t_emb not in (QT.F32, QT.F16)
    expected_emb = gguf.quants.dequantize(raw_emb, t_emb) if quantized else raw_emb.astype(np.float32)
    np.testing.assert_array_equal(w["token_embd"], expected_emb)
    m = refllama.load(path)  # and the whole pipeline runs on it
    out = m.logits(m.tokenize("the the"))
    assert out.shape == (len(m.tokenize("the the")), len(TINY_TOKENS)) and np.isfinite(out).all()


def test_quantized_weights_round_trip_within_their_precision(tmp_path):
    rng = np.random.default_rng(1)
    tensors = tiny_tensors(QT.F32)
    original = rng.standard_normal((256, 256)).astype(np.float32)
    tensors["blk.0.ffn_up.weight"] = (gguf.quants.quantize(original, QT.Q8_0), QT.Q8_0)
    w = load_gguf(write_gguf(tmp_path / "q8.gguf", tiny_metadata(), tensors)).weights
    # Q8_0: one f16 scale per 32 values, 127 steps each side: error <= scale / 2 = max|block| / 254
    assert np.abs(w["layers"][0]["ffn_up"] - original).max() <= np.abs(original).max() / 254 * 1.01


def _expect_error(path, *fragments):
    with pytest.raises(refllama.RefllamaError) as e:
        refllama.load(path)
    msg = str(e.value)
    assert "\n" not in msg
    for f in fragments:
        assert f in msg, msg
    return msg


def test_missing_file(tmp_path):
    _expect_error(tmp_path / "nope.gguf", "nope.gguf", "no such model file")


def test_not_a_gguf_file(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"PK\x03\x04 this is a zip")
    _expect_error(p, "model.gguf", "not a GGUF file")


@pytest.mark.parametrize("keep", [0.5, 0.97])
def test_truncated_file(tiny_gguf, keep):
    data = tiny_gguf.read_bytes()
    tiny_gguf.write_bytes(data[: int(len(data) * keep)])
    _expect_error(tiny_gguf, "tiny.gguf", "truncated")


def test_truncated_header(tiny_gguf):
    tiny_gguf.write_bytes(tiny_gguf.read_bytes()[:200])
    _expect_error(tiny_gguf, "tiny.gguf", "truncated")


def test_missing_tensor(tmp_path):
    tensors = tiny_tensors()
    del tensors["blk.1.ffn_gate.weight"]
    path = write_gguf(tmp_path / "m.gguf", tiny_metadata(), tensors)
    _expect_error(path, "m.gguf", "missing tensor 'blk.1.ffn_gate.weight'")


def test_wrong_tensor_shape(tmp_path):
    tensors = tiny_tensors()
    tensors["blk.0.attn_k.weight"] = (np.zeros((64, 256), np.float32), QT.F32)
    path = write_gguf(tmp_path / "m.gguf", tiny_metadata(), tensors)
    _expect_error(path, "'blk.0.attn_k.weight'", "[64, 256]", "[128, 256]")


@pytest.mark.parametrize("qtype", list(GGMLType), ids=lambda t: t.name)
def test_type_table_equals_gguf_py(qtype):
    assert QT[qtype.name] == qtype and gguf.GGML_QUANT_SIZES[QT[qtype.name]] == BLOCK_SIZES[qtype]
    assert byte_shape((3, 512), qtype) == gguf.quant_shape_to_byte_shape((3, 512), QT[qtype.name])


@pytest.mark.slow
def test_numba_path_does_not_import_gguf_py(model):
    """Its package import costs 2 to 3.4 MB (gguf_loader.GGMLType); SmolLM2 needs none of its functions."""
    code = (f"import sys, refllama; m = refllama.load({model.path!r}, backend='numba', n_ctx=8); m.logits([1, 2]);"
            "print(sorted(k for k in sys.modules if k.split('.')[0] in ('gguf', 'sentencepiece')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_unsupported_tensor_type(tmp_path):
    tensors = tiny_tensors()
    shape = (256, 256)
    tensors["blk.0.attn_q.weight"] = (np.zeros(gguf.quant_shape_to_byte_shape(shape, QT.IQ4_NL), np.uint8), QT.IQ4_NL)
    path = write_gguf(tmp_path / "m.gguf", tiny_metadata(), tensors)
    _expect_error(path, "'blk.0.attn_q.weight'", "unsupported type IQ4_NL")


@pytest.mark.parametrize("field", ["llama.block_count", "llama.embedding_length", "llama.attention.head_count",
                                   "llama.feed_forward_length", "llama.context_length",
                                   "llama.attention.layer_norm_rms_epsilon", "tokenizer.ggml.tokens"])
def test_missing_metadata_field(tmp_path, field):
    meta = tiny_metadata()
    del meta[field]
    _expect_error(write_gguf(tmp_path / "m.gguf", meta, tiny_tensors()), "m.gguf", field)


def test_unsupported_architecture(tmp_path):
    meta = {k.replace("llama.", "falcon."): v for k, v in tiny_metadata().items()}
    _expect_error(write_gguf(tmp_path / "m.gguf", meta, tiny_tensors(), arch="falcon"),
                  "general.architecture 'falcon'")


def test_unsupported_rope_scaling(tmp_path):
    meta = tiny_metadata()
    meta["llama.rope.scaling.type"] = ("longrope", gguf.GGUFValueType.STRING)
    _expect_error(write_gguf(tmp_path / "m.gguf", meta, tiny_tensors()), "llama.rope.scaling.type 'longrope'")


def test_unknown_pre_tokenizer(tmp_path):
    meta = tiny_metadata()
    meta["tokenizer.ggml.pre"] = ("mystery", gguf.GGUFValueType.STRING)
    _expect_error(write_gguf(tmp_path / "m.gguf", meta, tiny_tensors()), "tokenizer.ggml.pre 'mystery'")


@pytest.mark.parametrize("name", ["pytorch_model.bin", "consolidated.00.pth", "model.pt"])
def test_pickle_checkpoints_are_refused_without_reading(tmp_path, name):
    p = tmp_path / name
    p.write_bytes(b"\x80\x04 not even read")
    _expect_error(p, name, "pickle")


def test_directory_is_not_a_gguf_file(tmp_path):
    _expect_error(tmp_path, "directory")


def test_cli_reports_bad_model_in_one_line_and_fails(tmp_path):
    p = tmp_path / "broken.gguf"
    p.write_bytes(b"GGUF\x03\x00\x00\x00")
    r = subprocess.run([sys.executable, "-m", "refllama.run", "-m", str(p), "-n", "1"], capture_output=True, text=True)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("refllama: error:") and "broken.gguf" in lines[0], r.stderr


def test_linear_rope_scaling_and_tiny_dims_read_from_metadata(tmp_path):
    meta = tiny_metadata()
    meta["llama.rope.scaling.type"] = ("linear", gguf.GGUFValueType.STRING)
    meta["llama.rope.scaling.factor"] = (4.0, gguf.GGUFValueType.FLOAT32)
    cfg = load_gguf(write_gguf(tmp_path / "m.gguf", meta, tiny_tensors())).config
    assert (cfg.rope_scale, cfg.n_layer, cfg.n_head_kv) == (4.0, TINY["n_layer"], TINY["n_head_kv"])


def test_a_sliding_window_in_llama_metadata_is_applied(tmp_path):
    """`llama` files converted from Mistral may carry `llama.attention.sliding_window`: the mask then keeps only the
    last `window` keys of each query."""
    meta = tiny_metadata()
    meta["llama.attention.sliding_window"] = (3, gguf.GGUFValueType.UINT32)
    windowed = refllama.load(write_gguf(tmp_path / "w.gguf", meta, tiny_tensors()))
    full = refllama.load(write_gguf(tmp_path / "f.gguf", tiny_metadata(), tiny_tensors()))
    assert (windowed.config.sliding_window, full.config.sliding_window) == (3, None)
    ids = [1, 2, 3, 4, 5, 6]
    np.testing.assert_array_equal(windowed.logits(ids)[:3], full.logits(ids)[:3])  # within the window: the same
    assert not np.allclose(windowed.logits(ids)[3:], full.logits(ids)[3:])
