"""The dense families of 2025-2026 (tools/make_tiny_gguf.py: Gemma 2, SmolLM3, OLMo 2, Granite, Qwen3 with YaRN,
Llama 3.2, Phi-4-mini's shape, made by transformers and converted by llama.cpp's converter): the HF directories they
were made from load as their GGUF files do, match transformers stage by stage and greedy, and match llama.cpp's
greedy text where the two references agree; each family's options read as both references read them, the ones
refllama does not compute refused by name; where the references disagree, the notes compare prints.
(The GGUF files against both references, every stage and numerics "ggml" on every CPU path:
tests/test_gguf_families.py.)"""

import json
import math
import shutil

import numpy as np
import pytest
from families import GGUF, names
from test_gguf_families import DATA, F32_TOL, N_CTX, ref, rel_err
from tiers import param

import refllama
from refllama import arch
from refllama.check.compare import compare
from refllama.check.dump import Dump
from refllama.check.tolerances import band
from refllama.formats.gguf_loader import Field, GGUFFile
from refllama.layers import yarn_dims, yarn_mscale

NEW = names(hf_model=True, experts=False)  # the dense families kept as HF directories too
SHARED = ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "rope_dim", "rope_base", "rope_scale",
          "rope_yarn", "tied_output", "sliding_window", "swa_layers", "attn_scale", "logit_softcap",
          "attn_softcap", "nope_layers", "embedding_scale", "residual_scale", "logit_scale")


def hf_dir(family):
    return DATA / f"gguf-{family}" / "hf-model"


@pytest.mark.parametrize("family", NEW)
def test_the_hf_directory_reads_as_its_gguf_and_matches_transformers(family):
    r = ref(family)
    hf = refllama.load(hf_dir(family), n_ctx=N_CTX)
    gguf = refllama.load(DATA / f"gguf-{family}" / f"{family}-f32.gguf", n_ctx=N_CTX)
    assert hf.config.arch == gguf.config.arch == GGUF[family].arch
    for field in SHARED:
        a, b = getattr(hf.config, field), getattr(gguf.config, field)
        assert a == b or (isinstance(a, float) and math.isclose(a, b, rel_tol=1e-6)), field
    assert math.isclose(hf.config.rope_attn_factor, gguf.config.rope_attn_factor, rel_tol=1e-6)
    ids = r["token_ids"].tolist()
    with refllama.trace(hf) as t:
        logits = hf.logits(ids)
    assert rel_err(logits, r["hf_logits"]) < F32_TOL
    for i in range(hf.config.n_layer - 1):
        assert rel_err(t[f"l_out-{i}"], r["hf_hidden_states"][i + 1]) < F32_TOL, f"l_out-{i}"
    assert rel_err(gguf.logits(ids), r["hf_logits"]) < F32_TOL


@pytest.mark.parametrize("family", NEW)
def test_every_stage_transformers_exposes_matches_at_float32(family, tmp_path):
    m, r = refllama.load(hf_dir(family), n_ctx=N_CTX), ref(family)
    theirs = Dump(DATA / f"gguf-{family}" / "hf")
    report = compare(m.dump(r["token_ids"].tolist(), tmp_path / "ours"), DATA / f"gguf-{family}" / "hf", m)
    assert len(report.rows) == len(theirs.names) >= 10 * m.config.n_layer
    assert not [line for line in report.coverage if line.startswith("unknown stage")], report.coverage
    for row in report.rows:
        assert row["max_rel"] <= band("float32", row["stage"])[0], f"{row['name']}: {row['max_rel']:.2e}"


@pytest.mark.parametrize("family", NEW)
def test_greedy_text_is_both_references(family):
    """refllama's greedy continuation (float32, the F32 file) is transformers' and, where the two agree at float32
    (all but Gemma 2, whose llama.cpp computes GELU from a float16 table), llama.cpp's (F32 file and cache)."""
    m, r = refllama.load(DATA / f"gguf-{family}" / f"{family}-f32.gguf", n_ctx=N_CTX), ref(family)
    ids = r["token_ids"].tolist()
    hf, llamacpp = (Dump(DATA / f"gguf-{family}" / d).manifest["greedy"] for d in ("hf", "llamacpp-f32"))
    seq = list(ids)
    for _ in hf:
        seq.append(int(m.logits(seq)[-1].argmax()))
    ours = seq[len(ids):]
    assert ours == hf
    if not GGUF[family].gelu_table:
        assert ours == llamacpp


def test_the_families_differ_where_they_say():
    """Each family's difference is in the config the tiny model was made with, so that the tests above can fail."""
    cfg = {f: refllama.load(hf_dir(f), n_ctx=N_CTX).config for f in NEW}
    assert cfg["gemma2"].swa_layers == (True, False, True, False) and cfg["gemma2"].attn_softcap == 0.5
    assert cfg["smollm3"].nope_layers == (False, False, False, True)
    assert cfg["granite"].embedding_scale == 12.0 and cfg["granite"].residual_scale == 0.22
    assert cfg["granite"].logit_scale == 8.0 and cfg["granite"].kq_scale == 0.1
    assert cfg["yarn"].rope_yarn == (32.0, 1.0, True) and yarn_dims(cfg["yarn"]) == (0.0, 3.0)
    assert cfg["yarn"].rope_scale == 4.0
    assert cfg["phi4"].rope_dim == 12 and cfg["phi4"].head_dim == 16
    assert "rope_freqs" in refllama.load(hf_dir("llama32"), n_ctx=N_CTX).weights


def edited(family, tmp_path, change):
    d = tmp_path / family
    shutil.copytree(hf_dir(family), d)
    c = json.loads((d / "config.json").read_text())
    change(c)
    (d / "config.json").write_text(json.dumps(c))
    return d


def test_smollm3_reads_its_nope_layers_from_the_config_and_llamacpps_fixed_period_from_gguf(tmp_path):
    """transformers reads `no_rope_layers` (or the interval); llama.cpp's smollm3 graph fixes every 4th layer."""
    d = edited("smollm3", tmp_path, lambda c: c.update(no_rope_layers=[1, 0, 1, 1]))
    assert refllama.load(d).config.nope_layers == (False, True, False, False)
    d = edited("smollm3", tmp_path / "b", lambda c: (c.pop("no_rope_layers"), c.update(no_rope_layer_interval=2)))
    assert refllama.load(d).config.nope_layers == (False, True, False, True)
    d = edited("smollm3", tmp_path / "c", lambda c: c.update(no_rope_layers=[1, 0]))
    with pytest.raises(refllama.RefllamaError, match="no_rope_layers' must list 1 .RoPE. or 0 .NoPE. for each of 4"):
        refllama.load(d)


@pytest.mark.parametrize("family, change, message", [
    ("smollm3", lambda c: c.update(use_sliding_window=True), "'use_sliding_window': true (SmolLM3)"),
    ("olmo2", lambda c: c.update(attention_bias=True), "'attention_bias': true (OLMo 2)"),
    ("granite", lambda c: c.update(mlp_bias=True), "'mlp_bias': true (Granite)"),
    ("gemma2", lambda c: c.update(use_bidirectional_attention=True), "'use_bidirectional_attention': true"),
    ("yarn", lambda c: c["rope_parameters"].update(truncate="no"), "truncate must be true or false"),
])
def test_options_refllama_does_not_compute_are_refused_by_name(family, change, message, tmp_path):
    with pytest.raises(refllama.RefllamaError, match=message.replace("(", r"\(").replace(")", r"\)")):
        refllama.load(edited(family, tmp_path, change))


@pytest.mark.parametrize("family, key, value, message", [
    ("olmo2", "olmo2.attention.sliding_window", Field(4, False, 4096), "OLMo 3's sliding-window layers"),
    ("granite", "granite.rope.scaling.finetuned", Field(7, False, False), "Granite without RoPE"),
    ("yarn", "qwen3.rope.scaling.yarn_log_multiplier", Field(6, False, 0.1), "yarn_log_multiplier 0.1"),
])
def test_gguf_options_refllama_does_not_compute_are_refused_by_name(family, key, value, message):
    g = GGUFFile(DATA / f"gguf-{family}" / f"{family}-f32.gguf")
    g.fields[key] = value
    with pytest.raises(refllama.RefllamaError, match=message):
        arch.get(GGUF[family].arch).config_from_gguf(g)


def test_a_gguf_yarn_takes_the_files_betas_and_attention_factor_which_llamacpp_reads_only_for_grok():
    """As transformers reads them from the config the converter wrote them from (docs/references.md)."""
    g = GGUFFile(DATA / "gguf-yarn" / "yarn-f32.gguf")
    cfg = arch.qwen3.config_from_gguf(g)
    assert cfg.rope_yarn == (32.0, 1.0, True) and yarn_dims(cfg) == (0.0, 3.0) and cfg.rope_attn_factor == 1.0
    g.fields["qwen3.rope.scaling.yarn_beta_slow"] = Field(6, False, 0.25)
    g.fields["qwen3.rope.scaling.yarn_attn_factor"] = Field(6, False, 1.5)
    cfg = arch.qwen3.config_from_gguf(g)
    assert yarn_dims(cfg) == (0.0, 5.0) and math.isclose(cfg.rope_attn_factor * yarn_mscale(4.0), 1.5)


YARN_CONFIGS = {  # rope_parameters of the tiny Qwen3, each as transformers reads it
    "default": {},
    "betas": {"beta_fast": 16.0, "beta_slow": 0.5},
    "attention_factor": {"attention_factor": 1.5},
    "mscale": {"mscale": 1.0, "mscale_all_dim": 0.5},
    "untruncated": {"truncate": False},  # gpt-oss's: a ramp between fractional dims
    "factor from contexts": {"factor": None},  # max_position_embeddings (512) / original_max_position_embeddings
}


@pytest.mark.parametrize("variant", YARN_CONFIGS)
def test_yarn_cos_and_sin_are_transformers(variant, tmp_path):
    """refllama's RoPE tables for each YaRN option against transformers' own YaRN frequencies and attention factor
    (transformers' angles are float32 products: up to 1.5e-5 radians off at these positions; a wrong ramp, factor
    or attention factor is off by 1e-3 or more)."""
    pytest.importorskip("transformers", reason="transformers computes the reference frequencies")
    import torch
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    d = edited("yarn", tmp_path, lambda c: (c["rope_parameters"].update(YARN_CONFIGS[variant]),
                                            c.update(max_position_embeddings=512)))
    m = refllama.load(d, n_ctx=N_CTX)
    inv_freq, attention = ROPE_INIT_FUNCTIONS["yarn"](AutoConfig.from_pretrained(d), "cpu")
    angle = torch.arange(N_CTX, dtype=torch.float32)[:, None] * inv_freq[None, :]
    np.testing.assert_allclose(m.cache.cos, (angle.cos() * attention).numpy(), atol=2e-5)
    np.testing.assert_allclose(m.cache.sin, (angle.sin() * attention).numpy(), atol=2e-5)


def test_a_gemma2_softmax_scale_llamacpp_cannot_express_is_noted_against_its_dump(tmp_path):
    """query_pre_attn_scalar is read from config.json; llama.cpp has no field for it (HD^-1/2 but for the 27B)."""
    d = edited("gemma2", tmp_path, lambda c: c.update(query_pre_attn_scalar=64))
    m = refllama.load(d, n_ctx=N_CTX)
    assert m.config.kq_scale == 64 ** -0.5
    ids = ref("gemma2")["token_ids"].tolist()
    rep = compare(m.dump(ids, tmp_path / "ours"), DATA / "gguf-gemma2" / "llamacpp-f32", m)
    assert any("query_pre_attn_scalar" in n and "llama.cpp" in n for n in rep.notes), rep.notes


def test_comparing_llamacpps_gemma2_with_transformers_names_the_gelu_table(tmp_path):
    """The two references part at ffn_geglu (llama.cpp's float16 GELU table); compare says so and which is the
    model's (docs/references.md)."""
    m = refllama.load(DATA / "gguf-gemma2" / "gemma2-f32.gguf", n_ctx=N_CTX)
    rep = compare(DATA / "gguf-gemma2" / "llamacpp-f32", DATA / "gguf-gemma2" / "hf", m)
    assert rep.first["name"] == "ffn_geglu-0"
    assert sum("float16 table" in n for n in rep.notes) == 1, rep.notes
    rep = compare(DATA / "gguf-gemma2" / "hf", DATA / "gguf-gemma2" / "hf", m)
    assert not any("float16 table" in n for n in rep.notes)


def test_a_yarn_gguf_exports_as_the_yarn_transformers_reads(tmp_path):
    """refllama.convert writes YaRN's factor, original context, betas, attention factor and truncation (was: linear
    scaling, another model); the directory reloads to transformers' logits."""
    from refllama.convert import convert

    out = convert(DATA / "gguf-yarn" / "yarn-f32.gguf", tmp_path / "out")
    rope = json.loads((out / "config.json").read_text())["rope_scaling"]
    assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"]) == ("yarn", 4.0, 64)
    assert (rope["beta_fast"], rope["beta_slow"], rope["truncate"]) == (32.0, 1.0, True)
    r = ref("yarn")
    assert rel_err(refllama.load(out, n_ctx=N_CTX).logits(r["token_ids"].tolist()), r["hf_logits"]) < F32_TOL


@pytest.mark.parametrize("backend", ["numpy", param("numba", fast=False)])
@pytest.mark.parametrize("family", NEW)
def test_every_stage_of_the_q8_0_file_in_ggml_numerics_is_llamacpps(family, backend):
    """numerics "ggml" on the Q8_0 file, stage by stage, against llama.cpp's own dump of it (float16 cache, the CPU
    path its manifest names): bit-equal at every stage of every layer, soft-caps, NoPE layers, post-norms,
    multipliers and YaRN's fused blend included (tools/make_tiny_gguf.py --ggml-stages)."""
    theirs = Dump(DATA / f"gguf-{family}" / "llamacpp-q8_0")
    m = refllama.load(DATA / f"gguf-{family}" / f"{family}-q8_0.gguf", n_ctx=N_CTX, numerics="ggml",
                      cpu_path=theirs.cpu_path, backend=backend)
    with refllama.trace(m) as t:
        m.logits(theirs.token_ids)
    assert len(theirs.names) == len(m.arch.INPUTS) + 2 + sum(map(len, arch.layer_stages(m.arch, m.config)))
    for name in theirs.names:
        np.testing.assert_array_equal(np.asarray(t[name]), theirs[name], err_msg=name)


@pytest.mark.parametrize("family", names(q8_0_stages=True))
def test_compare_holds_numerics_ggml_to_llamacpps_bits(family, tmp_path):
    """compare, given refllama's numerics "ggml" dump and llama.cpp's (both declaring one CPU path), claims every
    bit: every stage compared, none differing."""
    theirs = DATA / f"gguf-{family}" / "llamacpp-q8_0"
    m = refllama.load(DATA / f"gguf-{family}" / f"{family}-q8_0.gguf", n_ctx=N_CTX, numerics="ggml",
                      cpu_path=Dump(theirs).cpu_path)
    rep = compare(m.dump(Dump(theirs).token_ids, tmp_path / "ours"), theirs, m)
    assert rep.column.bits and rep.first is None and len(rep.rows) == len(Dump(theirs).names)
    assert all(r["bits_differ"] == 0 for r in rep.rows)
