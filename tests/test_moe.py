"""Mixtures of experts (tools/make_tiny_gguf.py: Mixtral, Qwen3-MoE, Qwen2-MoE, OLMoE made by transformers and
converted by llama.cpp's converter): the HF directories they were made from load as their GGUF files do and match
transformers; the routing reads as llama.cpp's build_moe_ffn; options refllama does not compute are refused by name.
(The GGUF files against both references, every stage and numerics "ggml": tests/test_gguf_families.py.)"""

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from families import GGUF, names
from test_gguf_families import DATA, F32_TOL, N_CTX, ref, rel_err
from tiers import first_fast

import refllama
from refllama import arch
from refllama.arch import blocks
from refllama.formats.gguf_loader import Field, GGUFFile
from refllama.layers import FLOAT32

ROOT = Path(__file__).resolve().parent.parent

MOE = names(experts=True)


@pytest.mark.parametrize("family", MOE)
def test_the_hf_directory_matches_transformers_and_its_gguf(family):
    r = ref(family)
    hf = refllama.load(DATA / f"gguf-{family}" / "hf-model", n_ctx=N_CTX)
    gguf = refllama.load(DATA / f"gguf-{family}" / f"{family}-f32.gguf", n_ctx=N_CTX)
    assert hf.config.arch == gguf.config.arch == GGUF[family].arch
    for field in ("n_expert", "n_expert_used", "n_ff_exp", "n_ff_shexp", "expert_norm", "moe_layers"):
        assert getattr(hf.config, field) == getattr(gguf.config, field), field
    ids = r["token_ids"].tolist()
    with refllama.trace(hf) as t:
        logits = hf.logits(ids)
    assert rel_err(logits, r["hf_logits"]) < F32_TOL
    assert rel_err(gguf.logits(ids), r["llamacpp_logits_f32"]) < F32_TOL
    for i in range(hf.config.n_layer - 1):
        assert rel_err(t[f"l_out-{i}"], r["hf_hidden_states"][i + 1]) < F32_TOL, f"l_out-{i}"


@pytest.mark.parametrize("family", MOE)
def test_each_token_takes_the_experts_llamacpp_chose(family):
    """The ids of ffn_moe_topk and their weights, slot by slot, are llama.cpp's (its dump of the F32 file), to float32's
    precision (gpt-oss's weights are logits first, softmaxed after)."""
    from refllama.check.dump import Dump

    m, r = refllama.load(DATA / f"gguf-{family}" / f"{family}-f32.gguf", n_ctx=N_CTX), ref(family)
    theirs = Dump(DATA / f"gguf-{family}" / "llamacpp-f32")
    with refllama.trace(m) as t:
        m.logits(r["token_ids"].tolist())
    for i in (i for i in range(m.config.n_layer) if m.config.is_moe(i)):  # DeepSeek's, GLM's: dense lead layers
        np.testing.assert_array_equal(t[f"ffn_moe_topk-{i}"], theirs[f"ffn_moe_topk-{i}"])
        for stage in ("ffn_moe_weights", "ffn_moe_weights_softmax",  # gpt-oss's: the K logits, then their softmax
                      "ffn_moe_weights_scaled"):  # DeepSeek's: renormalised, then scaled
            if f"{stage}-{i}" in t:
                want = theirs[f"{stage}-{i}"]
                np.testing.assert_allclose(t[f"{stage}-{i}"], want, atol=1e-5 * max(1.0, np.abs(want).max()))
        assert len(set(t[f"ffn_moe_topk-{i}"][:, 0].tolist())) > 1, "every token routed alike: a test that cannot fail"


def test_moe_ffn_reads_as_build_moe_ffn():
    """Top-k of the softmax, ties to the lower id, renormalised with llama.cpp's clamp, slot order kept."""
    rng = np.random.default_rng(0)
    E, K, D, F = 5, 2, 8, 4
    cfg = refllama.load(DATA / "gguf-mixtral" / "mixtral-f32.gguf", n_ctx=N_CTX).config
    cfg = type(cfg)(**{**cfg.__dict__, "n_expert": E, "n_expert_used": K, "n_ff_exp": F, "n_embd": D})
    router = np.zeros((E, D), np.float32)
    router[3, 0], router[1, 0] = 2.0, 2.0  # experts 1 and 3 tie; 1 comes first
    lw = {"ffn_gate_inp": router,
          "ffn_gate_exps": tuple(rng.standard_normal((E, F, D), dtype=np.float32)),
          "ffn_up_exps": tuple(rng.standard_normal((E, F, D), dtype=np.float32)),
          "ffn_down_exps": tuple(rng.standard_normal((E, D, F), dtype=np.float32))}
    h = np.zeros((1, D), np.float32)
    h[0, 0] = 1.0
    with refllama.trace() as t:
        out = blocks.moe_ffn(h, lw, cfg, FLOAT32, 0)
    assert t["ffn_moe_topk-0"].tolist() == [[1.0, 3.0]]
    np.testing.assert_allclose(t["ffn_moe_weights_norm-0"], [[0.5, 0.5]], rtol=1e-6)
    want = sum(0.5 * (lw["ffn_down_exps"][e] @ (FLOAT32.swiglu(lw["ffn_gate_exps"][e] @ h[0],
                                                                  lw["ffn_up_exps"][e] @ h[0]))) for e in (1, 3))
    np.testing.assert_allclose(out[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("key, value, message", [
    ("qwen3moe.expert_gating_func", 2, "unsupported qwen3moe.expert_gating_func 2"),  # sigmoid
    ("qwen3moe.expert_group_count", 4, "unsupported qwen3moe.expert_group_count 4"),
])
def test_routing_refllama_does_not_compute_is_refused_by_field(key, value, message):
    g = GGUFFile(DATA / "gguf-qwen3moe" / "qwen3moe-f32.gguf")
    g.fields[key] = Field(4, False, value)
    with pytest.raises(refllama.RefllamaError, match=message):
        arch.qwen3moe.config_from_gguf(g)


def test_an_expert_selection_bias_is_refused_by_name():
    g = GGUFFile(DATA / "gguf-qwen3moe" / "qwen3moe-f32.gguf")
    g.tensors["blk.0.exp_probs_b.bias"] = g.tensors["blk.0.ffn_norm.weight"]
    with pytest.raises(refllama.RefllamaError, match="unsupported tensor 'blk.0.exp_probs_b.bias'"):
        arch.qwen3moe.config_from_gguf(g)


def test_a_layer_hf_keeps_dense_reads_a_dense_feed_forward(tmp_path):
    """Qwen2-MoE's mlp_only_layers: the weights table is a function of the config, so layer 1 asks for a dense
    feed-forward (which this directory lacks, and the error names), layer 0 for experts."""
    d = tmp_path / "qwen2moe"
    shutil.copytree(DATA / "gguf-qwen2moe" / "hf-model", d)
    c = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**c, "mlp_only_layers": [1]}))
    with pytest.raises(refllama.RefllamaError, match="missing tensor 'model.layers.1.mlp.gate_proj.weight'"):
        refllama.load(d)
    cfg = refllama.load(DATA / "gguf-qwen2moe" / "hf-model").config
    stages = arch.layer_stages(arch.qwen2moe, type(cfg)(**{**cfg.__dict__, "moe_layers": (True, False)}))
    assert "ffn_moe_topk" in stages[0] and "ffn_shexp" in stages[0]
    assert "ffn_moe_topk" not in stages[1] and stages[1] == arch.qwen2moe.STAGES


def test_a_mixtral_file_is_a_llama_file_with_experts():
    """The issue's first symptom: `llama` with experts once failed with "missing tensor 'blk.0.ffn_gate.weight'"."""
    m = refllama.load(DATA / "gguf-mixtral" / "mixtral-f32.gguf", n_ctx=N_CTX)
    assert m.config.moe_layers == (True, True) and m.config.expert_norm
    assert len(m.weights["layers"][0]["ffn_gate_exps"]) == m.config.n_expert


@pytest.mark.parametrize("family", MOE)
def test_every_stage_transformers_exposes_matches_at_float32(family, tmp_path):
    """refllama's dump against transformers' (the HF weights, float32, eager): the router, its softmax, the chosen
    ids and weights, each block's output (Qwen2-MoE's shared expert too), end to end within the float32 bands."""
    from refllama.check.compare import compare
    from refllama.check.dump import Dump
    from refllama.check.tolerances import band

    m, r = refllama.load(DATA / f"gguf-{family}" / "hf-model", n_ctx=N_CTX), ref(family)
    theirs = Dump(DATA / f"gguf-{family}" / "hf")
    assert {f"ffn_moe_topk-{i}" for i in range(m.config.n_layer) if m.config.is_moe(i)} <= set(theirs.names)
    report = compare(m.dump(r["token_ids"].tolist(), tmp_path / "ours"), DATA / f"gguf-{family}" / "hf", m)
    rows = report.rows
    assert len(rows) == len(theirs.names)
    assert not [line for line in report.coverage if line.startswith("unknown stage")], report.coverage
    first = next(i for i in range(m.config.n_layer) if m.config.is_moe(i))
    assert [n for n in Dump(tmp_path / "ours").names if "ffn_moe" in n][0] == f"ffn_moe_logits-{first}"  # in order
    for row in rows:
        assert row["max_rel"] <= band("float32", row["stage"])[0], f"{row['name']}: {row['max_rel']:.2e}"


def test_export_of_a_mixture_of_experts_is_refused_before_anything_is_written(tmp_path):
    from refllama.convert import convert

    with pytest.raises(refllama.RefllamaError, match="export of mixture-of-experts models is not supported"):
        convert(DATA / "gguf-mixtral" / "mixtral-f32.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# ---- the harness on mixtures of experts: an engine with each routing bug, against llama.cpp's dump of the F32 file

def _dump_with(family, bug, tmp_path, monkeypatch):
    """refllama's dump of the family's F32 file with `bug` applied to the model (or to blocks, undone before
    compare re-runs anything), and compare's report against llama.cpp's dump, with the correct model."""
    from refllama.check.compare import compare

    path = DATA / f"gguf-{family}" / f"{family}-f32.gguf"
    m, ids = refllama.load(path, n_ctx=N_CTX), ref(family)["token_ids"].tolist()
    with monkeypatch.context() as patch:
        bug(m, patch)
        mine = m.dump(ids, tmp_path / "mine")
    return compare(mine, DATA / f"gguf-{family}" / "llamacpp-f32", refllama.load(path, n_ctx=N_CTX))


def _sigmoid(m, patch):
    m.ops = m.ops._replace(softmax=lambda x: 1 / (1 + np.exp(-x)))


def _renormalisation(m, patch):
    m.config = dataclasses.replace(m.config, expert_norm=not m.config.expert_norm)


def _experts_shifted(m, patch):
    for lw in m.weights["layers"]:
        for k in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            lw[k] = lw[k][1:] + lw[k][:1]


def _router_shifted(m, patch):
    for lw in m.weights["layers"]:
        lw["ffn_gate_inp"] = np.roll(lw["ffn_gate_inp"], 1, axis=0)


def _least_probable(m, patch):  # top-k taken from the wrong end
    real = np.argsort
    patch.setattr(np, "argsort", lambda a, axis=-1, kind=None: real(np.negative(a), axis=axis, kind=kind))


def _tapped(patch, change):  # blocks.tap with change(name, layer, value, seen) -> the value the forward goes on with
    real, seen = blocks.tap, {}

    def tap(name, i, x):
        seen[name] = x
        return real(name, i, change(name, i, x, seen))
    patch.setattr(blocks, "tap", tap)


def _weights_in_other_slots(m, patch):  # each expert weighted by the next slot's weight
    _tapped(patch, lambda name, i, x, seen: np.roll(x, 1, axis=-1) if name == "ffn_moe_weights" else x)


def _weighted_by_other_slots(m, patch):  # the weights right, the weighted product taking the next slot's
    def change(name, i, x, seen):
        if name != "ffn_moe_weighted":
            return x
        w = seen.get("ffn_moe_weights_norm", seen["ffn_moe_weights"])[:, :, None]
        return x / w * np.roll(w, 1, axis=1)
    _tapped(patch, change)


def _router_reads_the_residual(m, patch):  # ffn_gate_inp applied to ffn_inp, not ffn_norm
    def change(name, i, x, seen):
        return seen["ffn_inp"] @ m.weights["layers"][i]["ffn_gate_inp"].T if name == "ffn_moe_logits" else x
    _tapped(patch, change)


def _shared_gate_without_sigmoid(m, patch):
    _tapped(patch, lambda name, i, x, seen: seen["ffn_shexp_gate_inp"] if name == "ffn_shexp_gate" else x)


def _no_shared_expert(m, patch):
    patch.setattr(blocks, "shared_expert", lambda h, lw, ops, i: 0 * h)


def _ungated_shared_expert(m, patch):
    patch.setattr(blocks, "shared_expert", lambda h, lw, ops, i: blocks.gated_ffn(h, lw, ops, "swiglu", i, "_shexp"))


@pytest.mark.parametrize("family, bug, stage, hint", first_fast([  # the slow tier: the rest (test_hints holds each
    # registered hint to its injected bug in the fast one)
    ("qwen3moe", _sigmoid, "ffn_moe_probs-0", "matches a sigmoid of ffn_moe_logits"),
    ("mixtral", _renormalisation, "ffn_moe_weighted-0", "the K weights are not renormalised"),
    ("olmoe", _renormalisation, "ffn_moe_weighted-0", "renormalised to sum to 1 (or the softmax is taken over the K"),
    ("qwen3moe", _experts_shifted, "ffn_moe_gate-0", "made with expert e+1's matrices"),
    ("mixtral", _router_shifted, "ffn_moe_logits-0", "the router's rows (ffn_gate_inp) are read with an index off"),
    ("olmoe", _least_probable, "ffn_moe_topk-0", "the K least probable experts are chosen"),
    ("qwen2moe", _no_shared_expert, "ffn_out-0", "the shared expert (ffn_*_shexp) is not added"),
    ("qwen2moe", _ungated_shared_expert, "ffn_out-0", "its gate, sigmoid(ffn_gate_inp_shexp), is missing"),
    ("qwen3moe", _weights_in_other_slots, "ffn_moe_weights-0", "an expert is weighted by another slot's weight"),
    ("qwen3moe", _weighted_by_other_slots, "ffn_moe_weighted-0", "an expert is weighted by another slot's weight"),
    ("qwen2moe", _weighted_by_other_slots, "ffn_moe_weighted-0", "an expert is weighted by another slot's weight"),
    ("qwen3moe", _router_reads_the_residual, "ffn_moe_logits-0", "the router (ffn_gate_inp) applied to ffn_inp-0"),
    ("qwen3moe", _least_probable, "ffn_moe_topk-0", "the K least probable experts are chosen"),
    ("qwen2moe", _shared_gate_without_sigmoid, "ffn_shexp_gate-0", "gate is missing its sigmoid"),
    ("qwen2moe", _renormalisation, "ffn_moe_weighted-0", "renormalised to sum to 1"),
], n=4))
def test_each_routing_bug_is_named_at_its_stage_with_its_hint(family, bug, stage, hint, tmp_path, monkeypatch):
    report = _dump_with(family, bug, tmp_path, monkeypatch)
    assert report.first is not None and report.first["name"] == stage, report.first and report.first["name"]
    assert any(hint in h for h in report.hints), report.hints
    norm = refllama.load(DATA / f"gguf-{family}" / f"{family}-f32.gguf", n_ctx=N_CTX).config.expert_norm
    contradicts = "this model keeps them" if norm else "this model divides them by their sum"
    assert not any(contradicts in h for h in report.hints), report.hints  # no hint against the model's config


@pytest.mark.parametrize("family", ["qwen3moe", "gptoss"])
def test_experts_are_compared_by_id_not_by_slot(family, tmp_path, monkeypatch):
    """An engine that keeps a token's K experts in another order (here reversed) passes: slots are matched by id. Its
    every stage of a token's K slots reversed (gpt-oss's softmaxed weights and biased products among them)."""
    from refllama.check.compare import compare
    from refllama.check.dump import Dump

    path = DATA / f"gguf-{family}" / f"{family}-f32.gguf"
    m, ids = refllama.load(path, n_ctx=N_CTX), ref(family)["token_ids"].tolist()
    K = m.config.n_expert_used
    mine = Path(m.dump(ids, tmp_path / "mine"))
    reversed_ = set()
    for name in Dump(mine).names:
        f = mine / f"{name}.npy"
        a = np.load(f)
        if name.startswith("ffn_moe_") and a.ndim >= 2 and a.shape[1] == K:  # [T, K, ...]: a token's slots
            np.save(f, a[:, ::-1])
            reversed_.add(name.rsplit("-", 1)[0])
    assert {"ffn_moe_topk", "ffn_moe_weights", "ffn_moe_down"} <= reversed_
    report = compare(mine, DATA / f"gguf-{family}" / "llamacpp-f32", refllama.load(path, n_ctx=N_CTX))
    assert report.first is None, report.first["name"]


def test_another_number_of_experts_is_named(tmp_path, monkeypatch):
    def more(m, patch):
        m.config = dataclasses.replace(m.config, n_expert_used=m.config.n_expert_used + 1)

    with pytest.raises(refllama.RefllamaError, match="MINE routes each token to 3 experts where the model takes 2"):
        _dump_with("olmoe", more, tmp_path, monkeypatch)


@pytest.mark.parametrize("family", ["qwen3moe", "qwen2moe", "olmoe"])
def test_transformers_5s_fused_experts_read_as_the_per_expert_tensors(family, tmp_path):
    """transformers 5 keeps a layer's experts as `mlp.experts.gate_up_proj` [E, 2 FE, D] (gate rows, then up) and
    `mlp.experts.down_proj` [E, D, FE], its in-memory form; a directory saved that way loads to the same logits."""
    from safetensors.numpy import load_file, save_file

    src = DATA / f"gguf-{family}" / "hf-model"
    shutil.copytree(src, tmp_path / "fused")
    tensors = load_file(src / "model.safetensors")
    n_layer = json.loads((src / "config.json").read_text())["num_hidden_layers"]
    for i in range(n_layer):
        p = f"model.layers.{i}.mlp.experts."
        n_expert = len({k for k in tensors if k.startswith(p) and k.endswith(".up_proj.weight")})
        experts = [{m: tensors.pop(f"{p}{e}.{m}_proj.weight") for m in ("gate", "up", "down")} for e in range(n_expert)]
        tensors[p + "gate_up_proj"] = np.stack([np.concatenate([x["gate"], x["up"]]) for x in experts])
        tensors[p + "down_proj"] = np.stack([x["down"] for x in experts])
    save_file(tensors, str(tmp_path / "fused" / "model.safetensors"), metadata={"format": "pt"})
    ids = ref(family)["token_ids"].tolist()
    np.testing.assert_array_equal(refllama.load(tmp_path / "fused").logits(ids), refllama.load(src).logits(ids))


def test_error_in_stages_only_mine_holds_fails_where_it_entered(tmp_path, monkeypatch):
    """A REF without the routed stages (transformers exposes none of them): an engine whose experts are weighted by
    the wrong slot differs only in stages MINE alone holds, and every stage both hold re-runs within tolerance on
    its own inputs; compare still fails, at the first stage past its band, naming the stages the error entered in."""
    from refllama.check.compare import compare

    hf = tmp_path / "hf"
    shutil.copytree(DATA / "gguf-qwen3moe" / "hf", hf)
    manifest = json.loads((hf / "manifest.json").read_text())
    manifest["tensors"] = [t for t in manifest["tensors"] if not t["name"].startswith("ffn_moe")]
    (hf / "manifest.json").write_text(json.dumps(manifest))
    path, ids = DATA / "gguf-qwen3moe" / "qwen3moe-f32.gguf", ref("qwen3moe")["token_ids"].tolist()
    m = refllama.load(path, n_ctx=N_CTX)
    real = blocks.tap
    monkeypatch.setattr(blocks, "tap", lambda name, i, x: real(name, i, np.roll(x, 1, axis=-1)
                                                                 if name == "ffn_moe_weights" else x))
    mine = m.dump(ids, tmp_path / "mine")
    monkeypatch.undo()
    rep = compare(mine, hf, refllama.load(path, n_ctx=N_CTX))
    first = rep.first
    assert first is not None and first["name"] == "l_out-0" and not first["adds"], first
    assert first["entered"] == {"after": "ffn_norm-0", "only": {"MINE": [("ffn_moe_logits-0", "ffn_moe_out-0")]}}
    assert all(r["verdict"] == "within tolerance" for r in rep.rows[:rep.rows.index(first)])
    clean = compare(refllama.load(path, n_ctx=N_CTX).dump(ids, tmp_path / "clean"), hf, m)
    assert clean.first is None  # the same REF passes a correct engine


def test_a_routed_stage_is_broken_down_by_chosen_expert_and_expert_id(tmp_path, monkeypatch):
    """Where a routed stage diverges, the breakdown speaks of the token's chosen experts and of expert ids (the
    experts whose product is wrong), never of heads."""
    def one_expert_wrong(m, patch):  # expert 2's up matrix scaled: only the slots that chose it go wrong
        for lw in m.weights["layers"]:
            lw["ffn_up_exps"] = [w * 1.5 if e == 2 else w for e, w in enumerate(lw["ffn_up_exps"])]

    report = _dump_with("qwen3moe", one_expert_wrong, tmp_path, monkeypatch)
    assert report.first["name"] == "ffn_moe_up-0", report.first["name"]
    by_id = next(line for line in report.where if "by expert id" in line)
    assert by_id.endswith("wrong at 2"), report.where
    assert any("by chosen expert" in line for line in report.where)
    assert not any("head" in line for line in report.where), report.where


def _without_topk(dump):  # an engine's dump without ffn_moe_topk (FORMAT.md allows it), its slots in id order
    from refllama.check.metrics import SLOT_STAGES

    manifest = json.loads((dump / "manifest.json").read_text())
    manifest["tensors"] = [t for t in manifest["tensors"] if t["stage"] != "ffn_moe_topk"]
    (dump / "manifest.json").write_text(json.dumps(manifest))
    for t in manifest["tensors"]:
        if t["stage"] in SLOT_STAGES:
            topk = np.load(dump / t["file"].replace(t["stage"], "ffn_moe_topk"))
            order = np.argsort(topk, axis=1, kind="stable")
            a = np.load(dump / t["file"])
            np.save(dump / t["file"], np.take_along_axis(a, order.reshape(*order.shape, *[1] * (a.ndim - 2)), 1))


def test_without_ffn_moe_topk_the_slots_are_not_compared_and_said_so(tmp_path, monkeypatch):
    """No ffn_moe_topk in MINE: which expert a slot holds is unknown, so the per-slot stages are not compared (a
    note says why), the rest are: a correct engine with its slots in id order passes, and one that weights each
    expert by another slot's weight fails where the slots' sum is compared, the error entered in those stages."""
    from refllama.check.compare import compare

    path, ids = DATA / "gguf-qwen3moe" / "qwen3moe-f32.gguf", ref("qwen3moe")["token_ids"].tolist()
    m = refllama.load(path, n_ctx=N_CTX)
    clean = Path(m.dump(ids, tmp_path / "clean"))
    _without_topk(clean)
    rep = compare(clean, DATA / "gguf-qwen3moe" / "llamacpp-f32", m)
    assert rep.first is None, (rep.first, rep.hints)
    assert any("MINE dumps no ffn_moe_topk, so which expert each of a token's K slots holds is unknown" in n
               for n in rep.notes), rep.notes
    with monkeypatch.context() as patch:
        _weights_in_other_slots(m, patch)
        broken = Path(m.dump(ids, tmp_path / "broken"))
    _without_topk(broken)
    rep = compare(broken, DATA / "gguf-qwen3moe" / "llamacpp-f32", refllama.load(path, n_ctx=N_CTX))
    assert rep.first is not None and rep.first["name"] == "ffn_moe_out-0", rep.first
    only = rep.first["entered"]["only"]
    assert only["REF"] == [("ffn_moe_topk-0", "ffn_moe_topk-0")], only
    assert only["unaligned"] == [("ffn_moe_weights-0", "ffn_moe_weights-0"),
                                 ("ffn_moe_weights_norm-0", "ffn_moe_weighted-0")], only
    assert not any("renormalised" in h for h in rep.hints), rep.hints


def test_llamacpps_argsort_is_known_and_read_past(tmp_path):
    from refllama.check import DumpWriter
    from refllama.check.compare import compare

    path = DATA / "gguf-qwen3moe" / "qwen3moe-f32.gguf"
    m, ids = refllama.load(path, n_ctx=N_CTX), ref("qwen3moe")["token_ids"].tolist()
    with refllama.trace(m) as t:
        m.logits(ids)
    with DumpWriter(tmp_path / "mine", ids, arch="qwen3moe", qk_layout="half", model=str(path)) as w:
        for name, x in t.items():
            w.add(name, x)
            if name.startswith("ffn_moe_probs"):
                w.add(name.replace("probs", "argsort"), np.argsort(-np.asarray(x), axis=1).astype(np.float32))
    rep = compare(tmp_path / "mine", m.dump(ids, tmp_path / "ref"), m)
    assert rep.first is None and not any("unknown stage" in line for line in rep.coverage), rep.coverage
    assert any(n.startswith("not compared: ffn_moe_argsort") for n in rep.notes), rep.notes


@pytest.mark.slow
def test_dump_hf_dumps_each_mixture_so_compare_holds_an_engine_to_it(tmp_path, monkeypatch):
    """tools/dump_hf.py on each MoE family's HF directory: refllama's dump of the same tokens passes against it; an
    engine whose weights sit on other slots fails at ffn_moe_weights with its hint; one whose weighted products take
    another slot's weight (an error in stages transformers does not expose) fails, named as entered in the stages
    only MINE holds."""
    pytest.importorskip("torch", reason="tools/dump_hf.py needs torch (README: Regenerating the references)")
    pytest.importorskip("transformers", reason="tools/dump_hf.py needs transformers")
    from refllama.check.compare import compare

    for family in names(experts=True):
        hf = tmp_path / family
        r = subprocess.run([sys.executable, str(ROOT / "tools" / "dump_hf.py"), "-m", str(DATA / f"gguf-{family}" /
                            "hf-model"), "-p", "The quick brown fox", "-o", str(hf)], capture_output=True, text=True)
        assert r.returncode == 0 and "not dumped" in r.stdout, r.stdout + r.stderr
        m = refllama.load(DATA / f"gguf-{family}" / "hf-model", n_ctx=N_CTX)
        ids = json.loads((hf / "manifest.json").read_text())["token_ids"]
        assert compare(m.dump(ids, tmp_path / f"{family}-clean"), hf, m).first is None
        for bug in (_weights_in_other_slots, _weighted_by_other_slots):
            with monkeypatch.context() as patch:
                bug(m, patch)
                mine = m.dump(ids, tmp_path / f"{family}-{bug.__name__}")
            rep = compare(mine, hf, refllama.load(DATA / f"gguf-{family}" / "hf-model", n_ctx=N_CTX))
            assert rep.first is not None, (family, bug)
            if bug is _weights_in_other_slots:
                assert rep.first["name"] == "ffn_moe_weights-0" and rep.hinted == ["permuted_slot_weights"], rep.hints
            else:
                assert rep.first["entered"]["only"]["MINE"][0][0] == "ffn_moe_gate-0", (family, rep.first)
