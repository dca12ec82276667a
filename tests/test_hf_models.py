"""Hugging Face directories: tiny random models made by transformers (tools/make_tiny_models.py) give
transformers' logits and hidden states; config variants, sharding, export, and every error case."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from families import HF
from safetensors.numpy import save_file

import refllama
from refllama.api import Model
from refllama.convert import convert
from refllama.formats.hf_loader import Checkpoint

DATA = Path(__file__).parent / "data"
FAMILIES = {name: a for name, (a, _) in HF.items()}  # -> arch
N_CTX = 64  # Phi-3's original context: LongRoPE's short factors, which transformers takes for a 16-token sequence
TOL = 1e-5  # of the logit range: both sides compute in float32 from the same stored weights (measured ~2e-7)


def reference(name):
    return np.load(DATA / f"tiny-{name}" / "reference.npz")


def rel_err(got, want):
    return float(np.abs(got - want).max() / (want.max() - want.min()))


@pytest.mark.parametrize("name", FAMILIES)
def test_logits_and_hidden_states_match_transformers(name):
    m, r = refllama.load(DATA / f"tiny-{name}", n_ctx=N_CTX), reference(name)
    assert m.config.arch == FAMILIES[name]
    with refllama.trace(m) as t:
        logits = m.logits(r["token_ids"].tolist())
    assert rel_err(logits, r["logits"]) < TOL
    hs = r["hidden_states"]  # 0: embeddings, i: block i-1's output, last: after the final norm
    ours = [t[m.arch.INPUTS[-1]]] + [t[f"l_out-{i}"] for i in range(m.config.n_layer - 1)] + [t["result_norm"]]
    for i, (a, b) in enumerate(zip(ours, hs, strict=True)):
        assert rel_err(a, b) < TOL, f"hidden state {i}"


def test_each_gemma3_difference_is_needed():
    """Gemma 3's config as transformers reads it, and each of its departures from Llama matters: the (1 + w) norms,
    the window of the local layers, their RoPE base, the global layers' linear scaling, query_pre_attn_scalar
    (48 here, not head_dim), the soft-capped logits."""
    m, r = refllama.load(DATA / "tiny-gemma3"), reference("gemma3")
    c = m.config
    assert c.swa_layers == (True, False, True, False) and c.sliding_window == 5 and c.rope_base_swa == 10000.0
    assert (c.rope_base, c.rope_scale, c.kq_scale, c.logit_softcap) == (1e6, 4.0, 48 ** -0.5, 5.0)
    ids = r["token_ids"].tolist()
    assert rel_err(m.logits(ids), r["logits"]) < TOL
    for change in (dict(sliding_window=None, swa_layers=None), dict(rope_base_swa=1e6), dict(rope_scale=1.0),
                   dict(attn_scale=None), dict(logit_softcap=None)):
        assert rel_err(without(m, **change).logits(ids), r["logits"]) > 1e-3, change
    for lw in m.weights["layers"]:
        lw["attn_norm"] = lw["attn_norm"] - 1  # as stored in the HF file, without Gemma's + 1
    assert rel_err(m.logits(ids), r["logits"]) > 1e-3


@pytest.mark.parametrize("edit, fragment", [
    (lambda c: c.update(hidden_activation="silu"), "unsupported hidden_activation 'silu'"),
    (lambda c: (c.pop("layer_types"), c.update(sliding_window_pattern=0)), "'sliding_window_pattern' must be at least"),
    (lambda c: c.update(layer_types=["full_attention"]), "one entry per layer (1 entries for 4 layers)"),
    (lambda c: c["rope_parameters"]["sliding_attention"].update(rope_type="yarn"), "rope_type 'yarn' for sliding"),
    (lambda c: c.update(attn_logit_softcapping=50.0), "unsupported option 'attn_logit_softcapping'"),
    (lambda c: c["rope_parameters"]["sliding_attention"].update(rope_theta=-1), "rope_base_swa must be a finite"),
])
def test_a_bad_gemma3_config_is_named(tmp_path, edit, fragment):
    d = copy_model("gemma3", tmp_path)
    edit_config(d, edit)
    expect_error(d, "config.json", fragment)


def test_gemma3_transformers_4_config_loads_the_same(tmp_path):
    """v4 Gemma 3 configs: rope_theta, rope_local_base_freq, rope_scaling and sliding_window_pattern at the top."""
    d = copy_model("gemma3", tmp_path)

    def to_v4(c):
        rope = c.pop("rope_parameters")
        c["rope_theta"], c["rope_local_base_freq"] = rope["full_attention"]["rope_theta"], 10000.0
        c["rope_scaling"] = {"rope_type": "linear", "factor": rope["full_attention"]["factor"]}
        c["sliding_window_pattern"] = 2
        del c["layer_types"]
    edit_config(d, to_v4)
    ids = reference("gemma3")["token_ids"].tolist()
    np.testing.assert_array_equal(refllama.load(d).logits(ids), refllama.load(DATA / "tiny-gemma3").logits(ids))


def without(m, **changes):
    """The same weights under a changed config, to show a family's difference matters."""
    from dataclasses import replace

    return Model(m.path, replace(m.config, **changes), m.weights, m.tokenizer, m.chat_template, "numpy", np, N_CTX)


def test_each_family_difference_is_needed():
    """Turning off what a family changes from Llama breaks agreement, so the tests above see it."""
    ids = {n: reference(n)["token_ids"].tolist() for n in FAMILIES}
    mistral = refllama.load(DATA / "tiny-mistral")
    assert mistral.config.sliding_window == 5 and len(ids["mistral"]) > 5
    assert rel_err(without(mistral, sliding_window=None).logits(ids["mistral"]), reference("mistral")["logits"]) > 1e-3
    qwen = refllama.load(DATA / "tiny-qwen2")
    for lw in qwen.weights["layers"]:
        for b in ("attn_q_bias", "attn_k_bias", "attn_v_bias"):
            lw.pop(b)
    assert rel_err(qwen.logits(ids["qwen2"]), reference("qwen2")["logits"]) > 1e-3
    qwen3 = refllama.load(DATA / "tiny-qwen3")
    assert qwen3.config.head_dim == 32 != qwen3.config.n_embd // qwen3.config.n_head
    for lw in qwen3.weights["layers"]:
        lw["attn_q_norm"], lw["attn_k_norm"] = np.ones_like(lw["attn_q_norm"]), np.ones_like(lw["attn_k_norm"])
    assert rel_err(qwen3.logits(ids["qwen3"]), reference("qwen3")["logits"]) > 1e-3
    phi = refllama.load(DATA / "tiny-phi3", n_ctx=N_CTX)
    assert phi.config.rope_attn_factor > 1.0 and "rope_factors_short" in phi.weights
    assert rel_err(without(phi, rope_attn_factor=1.0).logits(ids["phi3"]), reference("phi3")["logits"]) > 1e-3
    llama = refllama.load(DATA / "tiny-llama")
    assert llama.config.head_dim == 32 != llama.config.n_embd // llama.config.n_head and llama.config.tied_output
    del llama.weights["rope_freqs"]
    plain = Model(llama.path, llama.config, llama.weights, None, None, "numpy", np)
    assert rel_err(plain.logits(ids["llama"]), reference("llama")["logits"]) > 1e-4


def copy_model(name, tmp_path):
    d = tmp_path / name
    shutil.copytree(DATA / f"tiny-{name}", d)
    return d


def edit_config(d, edit):
    c = json.loads((d / "config.json").read_text())
    edit(c)
    (d / "config.json").write_text(json.dumps(c))


def test_transformers_4_config_layout_loads_the_same(tmp_path):
    """v4 configs keep rope_theta/rope_scaling at the top level and say torch_dtype."""
    d = copy_model("llama", tmp_path)

    def to_v4(c):
        rope = c.pop("rope_parameters")
        c["rope_theta"] = rope.pop("rope_theta")
        c["rope_scaling"] = rope
        c["torch_dtype"] = c.pop("dtype")
    edit_config(d, to_v4)
    ids = reference("llama")["token_ids"].tolist()
    np.testing.assert_array_equal(refllama.load(d).logits(ids), refllama.load(DATA / "tiny-llama").logits(ids))


def test_sharded_checkpoint_loads_the_same(tmp_path):
    d = tmp_path / "sharded"
    d.mkdir()
    shutil.copy(DATA / "tiny-qwen2" / "config.json", d)
    ck = Checkpoint(DATA / "tiny-qwen2")
    names = sorted(ck.where)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in shards.items():
        save_file({k: ck.where[k].tensor(k) for k in keys}, str(d / shard))
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}))
    ids = reference("qwen2")["token_ids"].tolist()
    np.testing.assert_array_equal(refllama.load(d).logits(ids), refllama.load(DATA / "tiny-qwen2").logits(ids))
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(refllama.RefllamaError, match="model-00002-of-00002.safetensors: missing shard"):
        refllama.load(d)


def expect_error(d, *fragments):
    with pytest.raises(refllama.RefllamaError) as e:
        refllama.load(d)
    msg = str(e.value)
    assert "\n" not in msg and all(f in msg for f in fragments), msg


@pytest.mark.parametrize("field", ["hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size",
                                   "rms_norm_eps", "max_position_embeddings", "architectures"])
def test_missing_config_field_is_named(tmp_path, field):
    d = copy_model("mistral", tmp_path)
    edit_config(d, lambda c: c.pop(field))
    expect_error(d, "config.json", field)


def test_missing_rope_theta_is_named(tmp_path):
    d = copy_model("mistral", tmp_path)
    edit_config(d, lambda c: c["rope_parameters"].pop("rope_theta"))
    expect_error(d, "rope_theta")


def test_unknown_architecture_and_rope_scaling_are_named(tmp_path):
    d = copy_model("llama", tmp_path)
    edit_config(d, lambda c: c.update(architectures=["FalconForCausalLM"]))
    expect_error(d, "architectures", "FalconForCausalLM")
    d = copy_model("qwen2", tmp_path)
    edit_config(d, lambda c: c["rope_parameters"].update(rope_type="dynamic"))
    expect_error(d, "rope scaling type 'dynamic'")


def test_shape_mismatch_names_the_tensor(tmp_path):
    d = copy_model("qwen2", tmp_path)
    edit_config(d, lambda c: c.update(intermediate_size=64))
    expect_error(d, "model.layers.0.mlp.gate_proj.weight", "[128, 64]", "[64, 64]")


def test_truncated_safetensors(tmp_path):
    d = copy_model("phi3", tmp_path)
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    expect_error(d, "model.safetensors", "truncated")


def test_pickle_checkpoint_directory_is_refused(tmp_path):
    d = tmp_path / "old"
    d.mkdir()
    shutil.copy(DATA / "tiny-llama" / "config.json", d)
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04never unpickled")
    expect_error(d, "pytorch_model.bin", "pickle")


def test_directory_without_config(tmp_path):
    expect_error(tmp_path, "config.json")


def test_model_without_tokenizer_takes_ids_only():
    m = refllama.load(DATA / "tiny-mistral")
    assert m.logits([3, 4, 5]).shape == (3, 100)
    assert len(list(m.generate([3, 4, 5], max_tokens=3, temperature=0))) == 3
    with pytest.raises(refllama.RefllamaError, match="no tokenizer.json"):
        m.tokenize("hello")


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    return convert(model.path, tmp_path_factory.mktemp("export") / "smollm2")


@pytest.mark.slow
def test_exported_smollm2_gives_the_gguf_logits(model, exported):
    hf = refllama.load(exported)
    text = "The capital of France is"
    assert hf.tokenize(text) == model.tokenize(text)
    ids = model.tokenize(text)
    np.testing.assert_allclose(hf.logits(ids), model.logits(ids), atol=1e-5)
    assert hf.render_chat([{"role": "user", "content": "Hi"}]) == model.render_chat([{"role": "user", "content": "Hi"}])
    assert list(hf.chat([{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0)) == \
        list(model.chat([{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0))


def test_export_refuses_to_overwrite_and_leaves_nothing_on_failure(model, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    with pytest.raises(refllama.RefllamaError, match="not empty"):
        convert(model.path, tmp_path / "full")
    with pytest.raises(refllama.RefllamaError, match="dtype"):
        convert(model.path, tmp_path / "bad", dtype="q4")
    assert not (tmp_path / "bad").exists()


def test_exported_directory_loads_in_transformers_with_the_same_logits(model, exported):
    why = "the round trip needs torch and transformers, reference tools: pip install torch==2.13.0 transformers"
    torch = pytest.importorskip("torch", reason=why)
    transformers = pytest.importorskip("transformers", reason=why)
    hf = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).eval()
    ids = model.tokenize("The capital of France is")
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    assert rel_err(model.logits(ids), want) < 1e-4


@pytest.mark.slow
def test_cli_runs_the_exported_directory(exported):
    import subprocess
    import sys

    args = ["-p", "The capital of France is", "-n", "6", "--temp", "0"]
    run = [sys.executable, "-m", "refllama.run"]
    a = subprocess.run(run + args, capture_output=True, text=True)
    b = subprocess.run(run + ["-m", str(exported)] + args, capture_output=True, text=True)
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout, b.stderr


@pytest.mark.parametrize("name, option", [("qwen2", "use_sliding_window"), ("qwen3", "use_sliding_window"),
                                          ("qwen3", "attention_bias")])
def test_an_option_refllama_does_not_implement_is_refused_by_name(tmp_path, name, option):
    d = copy_model(name, tmp_path)
    edit_config(d, lambda c: c.update({option: True}))
    expect_error(d, "config.json", f"unsupported option '{option}'")


def test_a_missing_family_tensor_is_named(tmp_path):
    """Qwen3's k norm renamed in the safetensors header (same length), as a foreign checkpoint would name it."""
    d = copy_model("qwen3", tmp_path)
    f = d / "model.safetensors"
    name = b"model.layers.1.self_attn.k_norm.weight"
    data = f.read_bytes()
    assert data.count(name) == 1
    f.write_bytes(data.replace(name, name.replace(b"k_norm", b"k_xorm")))
    expect_error(d, "missing tensor 'model.layers.1.self_attn.k_norm.weight'")


def test_an_hf_directory_dumps_with_its_architecture_and_pair_layout(tmp_path):
    m = refllama.load(DATA / "tiny-qwen3")
    ids = reference("qwen3")["token_ids"].tolist()
    manifest = json.loads((m.dump(ids, tmp_path / "d") / "manifest.json").read_text())
    assert (manifest["arch"], manifest["qk_layout"], len(manifest["model_sha256"])) == ("qwen3", "half", 64)
    assert len(manifest["tensors"]) == 3 + 19 * m.config.n_layer  # Qwen3's 17 + Qcur_normed, Kcur_normed
