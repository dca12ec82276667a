"""The harness itself: a deliberately broken stage is named, with its layer, as the first divergence.

Each test breaks one thing in refllama's forward pass (monkeypatched for the test only), dumps the
short prompt, and compares the dump with the stored references through `refllama.compare`.
"""

import json
import subprocess
import sys

import harness
import numpy as np
import pytest

import refllama.layers
from refllama.check.compare import compare
from refllama.check.tolerances import REFERENCE_KINDS, TOLERANCES
from refllama.layers import rope_half, rope_interleaved

REF = harness.HERE / "ref"


def dump_short(model, tmp_path, name="dump"):
    ids = harness.smollm2_reference("hf", "short").manifest["token_ids"]
    return model.dump(ids, tmp_path / name, layers=[0, 1, 15, 29])  # the blocks the references keep


def wrong_kv_head_scores(q, k):  # query head h reads kv head h % KVH, not h // (H / KVH)
    T, H, HD = q.shape
    return np.einsum("thd,hsd->hts", q, k[np.arange(H) % k.shape[0]])


def broken_ops(mp, model, **steps):  # the model's operations table with some steps replaced
    mp.setattr(model, "ops", model.ops._replace(**steps))


BREAKS = {  # breakage -> (apply(monkeypatch, model), the stage named)
    "rope_layout_swapped": (lambda mp, m: mp.setitem(refllama.layers.ROPE, "interleaved", rope_half), "Qcur_rope-0"),
    "rms_eps_dropped": (lambda mp, m: broken_ops(mp, m, rms_norm=lambda x, w, eps: refllama.layers.rms_norm(x, w, 0.0)),
                        "attn_norm-0"),
    "wrong_kv_head": (lambda mp, m: broken_ops(mp, m, attention_scores=wrong_kv_head_scores), "kq-0"),
}


def test_unbroken_dump_is_within_tolerance_of_both_references(model, tmp_path):
    ours = dump_short(model, tmp_path)
    for ref, column in (("hf", "float32"), ("llamacpp", "llama.cpp")):
        rep = compare(ours, REF / ref / "short", model)
        assert rep.first is None, f"{ref}: {rep.first}"
        assert len(rep.rows) == 73 and rep.column.name == column


@pytest.mark.parametrize("breakage", [pytest.param(b, marks=() if i == 0 else (pytest.mark.slow,))  # the first fast
                                      for i, b in enumerate(BREAKS)])
def test_broken_stage_is_named_as_first_divergence(model, tmp_path, monkeypatch, breakage):
    apply, expected = BREAKS[breakage]
    with monkeypatch.context() as mp:
        apply(mp, model)
        ours = dump_short(model, tmp_path)
    for rerun in (model, None):  # each side's stages re-run on its own inputs, and end to end only
        first = compare(ours, REF / "hf" / "short", rerun).first
        assert first is not None and first["name"] == expected, first


def test_swapped_pair_layout_on_a_neox_family_is_named_at_qcur_rope(tmp_path, monkeypatch):
    """Qwen2 pairs (i, i + R/2) (llama.cpp's NEOX): rotating (2i, 2i+1) instead is named at Qcur_rope-0, against
    llama.cpp's own float32 dump (the tight column)."""
    m = harness.family_model("qwen2")
    ref = harness.DATA / "gguf-qwen2" / "llamacpp-f32"
    ids = harness.reference(ref).manifest["token_ids"]
    rep = compare(m.dump(ids, tmp_path / "clean"), ref, m)
    assert rep.first is None and rep.column.name == "float32", rep.first
    with monkeypatch.context() as mp:
        mp.setitem(refllama.layers.ROPE, "half", rope_interleaved)
        broken = m.dump(ids, tmp_path / "broken")
    rep = compare(broken, ref, m)
    first = rep.first
    assert first is not None and first["name"] == "Qcur_rope-0" and first["adds"] == ["MINE"], first
    assert sum("matches RoPE rotating the wrong pairs" in h for h in rep.hints) == 1, rep.hints
    assert not any("position" in h for h in rep.hints), rep.hints


@pytest.mark.slow  # two interpreters started (~10 s): the fast tier's compare runs in-process (tests/test_compare.py)
def test_compare_cli_exit_code_message_and_plot(model, tmp_path, monkeypatch):
    with monkeypatch.context() as mp:
        BREAKS["rope_layout_swapped"][0](mp, model)
        broken = dump_short(model, tmp_path, "broken")
    png = tmp_path / "errors.png"
    r = subprocess.run([sys.executable, "-m", "refllama.compare", str(broken), str(REF / "llamacpp" / "short"),
                        "--plot", str(png)], capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "first divergence: Qcur_rope-0" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    clean = dump_short(model, tmp_path, "clean")
    r = subprocess.run([sys.executable, "-m", "refllama.compare", str(clean), str(REF / "llamacpp" / "short")],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "all 73 stages within tolerance" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow
def test_a_ggml_engine_is_held_to_the_ggml_column_and_a_small_bug_is_named(tmp_path):
    """refllama in numerics "ggml" against llama.cpp: compare picks the ggml column (both dumps compute llama.cpp's
    arithmetic), re-runs stages in ggml numerics, and passes every stage. An eps of 1e-6 for 1e-5, invisible in
    the llama.cpp column, is then named at the first norm."""
    ggml = refllama.load(numerics="ggml", cpu_path=harness.llamacpp_path())  # the references' path, on any host
    clean = dump_short(ggml, tmp_path, "ggml-clean")
    rep = compare(clean, REF / "llamacpp" / "short", ggml)
    assert rep.column.name == "ggml" and rep.first is None, rep.first
    assert max(r["max_rel"] for r in rep.rows) == 0  # bit-equal to llama.cpp
    with pytest.MonkeyPatch.context() as mp:
        broken_ops(mp, ggml, rms_norm=lambda x, w, eps, norm=ggml.ops.rms_norm: norm(x, w, 1e-6))
        broken = dump_short(ggml, tmp_path, "ggml-eps")
    rep = compare(broken, REF / "llamacpp" / "short", ggml)
    assert rep.column.name == "ggml" and rep.first["name"] == "attn_norm-0"
    assert compare(broken, REF / "llamacpp" / "short", column="llama.cpp").first is None  # llama.cpp's noise hides it


def test_a_dump_written_by_hand_in_the_documented_format(model, tmp_path):
    """What another engine writes: plain np.save files and a manifest, q/k in the half-split layout."""
    ids = harness.smollm2_reference("llamacpp", "short").manifest["token_ids"]
    with refllama.trace(model) as t:
        model.logits(ids)
    d = tmp_path / "engine-dump"
    d.mkdir()
    half = np.concatenate([np.arange(0, 64, 2), np.arange(1, 64, 2)])  # interleaved -> half-split dims
    stages = {"attn_norm-0": t["attn_norm-0"], "Qcur_rope-0": t["Qcur_rope-0"][..., half],
              "l_out-0": t["l_out-0"], "l_out-1": t["l_out-1"] + 0.5}  # a bug in block 1
    tensors = []
    for name, a in stages.items():
        np.save(d / f"{name}.npy", a.astype(np.float32))
        stage, layer = name.rsplit("-", 1)
        tensors.append({"name": name, "stage": stage, "layer": int(layer), "file": f"{name}.npy",
                        "shape": list(a.shape), "dtype": "float32", "token_axis": 0,
                        "positions": list(range(len(ids)))})
    (d / "manifest.json").write_text(json.dumps({
        "format": "refllama-dump/1", "producer": "hand-written test engine", "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "model_sha256": "", "token_ids": ids, "qk_layout": "half", "tensors": tensors}))
    rep = compare(d, REF / "llamacpp" / "short")
    assert rep.column.name == "llama.cpp"
    assert [r["name"] for r in rep.rows] == ["attn_norm-0", "Qcur_rope-0", "l_out-0", "l_out-1"]
    assert rep.first["name"] == "l_out-1"


def readme_tolerances(path):
    """{column: {stage: (max_rel, nmse)}} from the markdown table whose rows start '| `stage` |'."""
    table = {kind: {} for kind in REFERENCE_KINDS}
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0].startswith("`") and len(cells) > 2 * len(table):
            for i, kind in enumerate(table):
                table[kind][cells[0].strip("`")] = (float(cells[1 + 2 * i]), float(cells[2 + 2 * i]))
    return table


def test_the_tolerance_table_in_the_package_equals_the_readme_table():
    """compare and the suite use refllama.check.tolerances (it ships in the wheel); the README explains each row."""
    assert readme_tolerances(harness.HERE / "README.md") == TOLERANCES


def test_compare_reports_coverage_and_names_a_misspelt_stage(model, tmp_path):
    """The summary says which layers were compared and what only one side holds; a stage name no architecture has
    is reported with the closest known name, not dropped silently. Entries may leave out stage, layer, file,
    token_axis and positions: they default from the name and the array."""
    ids = harness.smollm2_reference("llamacpp", "short").manifest["token_ids"]
    with refllama.trace(model) as t:
        model.logits(ids)
    d = tmp_path / "mine"
    d.mkdir()
    for name in ("attn_norm-0", "l_out-0", "l_out-1", "ffn_act-0"):
        np.save(d / f"{name}.npy", t[name if name != "ffn_act-0" else "ffn_swiglu-0"])
    (d / "manifest.json").write_text(json.dumps({
        "format": "refllama-dump/1", "producer": "test", "model_sha256": "", "token_ids": ids, "qk_layout": "half",
        "tensors": [{"name": n} for n in ("attn_norm-0", "l_out-0", "l_out-1", "ffn_act-0")]}))
    r = subprocess.run([sys.executable, "-m", "refllama.compare", str(d), str(REF / "llamacpp" / "short"), "--backend",
                        "numpy"], capture_output=True, text=True)  # the fast tier compiles no Numba kernel
    assert r.returncode == 0, r.stdout + r.stderr
    assert "compared: 3 stages in 2 layers (0-1)" in r.stdout
    assert "only in REF: 70" in r.stdout and "only in MINE: 1 (ffn_act-0)" in r.stdout
    assert "unknown stage 'ffn_act-0' (did you mean 'ffn_gate'?)" in r.stdout
