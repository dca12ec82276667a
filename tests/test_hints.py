"""Every registered hint (refllama.check.diagnose.HINTS) fires on the bug it names, alone: the bug injected
(refllama.check.bugs) into refllama's own dump of the first tiny family of the catalogue that can hold it, compare
names the stage the bug changed and says that hint and no other (where a hint names several bugs, the line of
this one)."""

import pytest
from families import GGUF
from tiers import param

import refllama
from refllama.check.bugs import inject
from refllama.check.compare import compare
from refllama.check.diagnose import HINTS

IDS, DECODE = list(range(3, 12)), [5]  # 9 tokens: past Gemma's window of 4; a decode step for the decode path


@pytest.fixture(scope="module")
def correct(tmp_path_factory):
    """(family, whether with a decode step) -> (model, its correct dump), made once: a prefill alone for the bugs of
    every position (a bug injected into the prefill only would leave the decode step right), with a decode step for
    the decode path's."""
    made = {}

    def get(family, decode):
        if (family, decode) not in made:
            m = refllama.load(GGUF[family].gguf(), n_ctx=64)
            out = tmp_path_factory.mktemp(family) / "ref"
            made[family, decode] = m, m.dump(IDS, out, decode_ids=DECODE if decode else None)
        return made[family, decode]
    return get


CASES = [(h, bug) for h in HINTS for bug in (h.bugs if isinstance(h.bugs, tuple) else (h.bugs,))]
WORDS = {  # where a hint names several bugs: the words of the line each must get
    "rope_positions_from_1": "positions p + 1", "rope_base_wrong": "matches RoPE with base",
    "manifest_names_the_other_layout": "should say", "q_k_rows_in_the_other_layout": "is wrong: the engine's",
    "sigmoid_router": "a sigmoid", "renormalised_where_kept": "renormalised to sum to 1",
    "decode_step_not_renormalised": "in the decode steps", "residual_multiplier_dropped": "residual multiplier",
    "embedding_multiplier_dropped": "embedding multiplier", "logits_not_scaled": "logits_scaling",
    "q_norm_skipped": "is skipped", "k_norm_over_the_whole_row": "over all its heads",
    "expert_ids_plus_1": "+1 (mod", "one_token_routed_elsewhere": "other experts chosen at 1 of",
    "shared_expert_left_out": "is not added", "shared_expert_ungated": "ungated",
    "ffn_norm_skipped": "is skipped", "norm_weight_not_applied": "without its weight",
    "residual_dropped": "the residual is not added", "attention_output_not_added": "is not added to the residual",
    "window_not_applied": "is not applied", "window_one_key_wide": "a window of",
    "position_embeddings_not_added": "are not added", "position_rows_plus_1": "p + 1",
    "attention_not_soft_capped": "without their soft-cap", "soft_cap_before_scale": "before the softmax scale",
    "window_on_the_other_layers": "this model's local layers are", "sinks_missing": "without the layer's sinks",
    "sinks_in_the_numerator": "numerator too", "router_bias_missing": "bias (ffn_gate_inp.bias) is not added",
    "softmax_over_every_expert": "softmax over all E experts", "swiglu_clamp_missing": "without its clamp",
    "swiglu_alpha_1": "alpha = 1", "expert_biases_missing": "are not added",
    "experts_dumped_biased": "dumped with its bias added",
    "softmax_for_sigmoid": "its own sigmoid", "selection_bias_on_the_weights": "added to the weights",
    "selection_bias_not_chosen_by": "before the experts are chosen", "expert_groups_ignored": "groups of experts",
    "routed_scaling_dropped": "routed_scaling_factor", "shared_experts_left_out": "is not added",
    "softmax_scale_without_mscale": "mscale squared", "q_pe_in_the_other_pairs": "rotated in pairs (i, i + R/2)",
    "k_pe_from_the_latents_dims": "the latent's",
}


@pytest.mark.parametrize("hint, bug", [  # a hint's first bug in the fast tier, its others in the slow one
    param(h, bug, fast=bug is (h.bugs[0] if isinstance(h.bugs, tuple) else h.bugs), id=f"{h.name}-{bug.__name__}")
    for h, bug in CASES])
def test_each_hint_fires_alone_on_its_bug(correct, tmp_path, hint, bug):
    for family, decode in ((f, d) for f in GGUF for d in (False, True)):
        m, ref = correct(family, decode)
        if hint.when is not None and not hint.when(m.config):
            continue
        changed = inject(bug, ref, tmp_path / f"{family}-{decode}", m)
        if changed is not None:
            break
    else:
        pytest.fail(f"no family of the catalogue holds {bug.__name__}")
    rep = compare(tmp_path / f"{family}-{decode}", ref, m)
    assert rep.first is not None and rep.first["name"] in {c.split("@")[0] for c in changed}, (family, rep.first)
    assert hint.stages is None or rep.first["stage"] in hint.stages
    assert set(rep.hinted) == {hint.name}, (family, rep.hints)
    assert WORDS.get(bug.__name__, "") in " ".join(rep.hints), (family, rep.hints)


SPARSE = {  # hybrid hints whose detectors read the stage's inputs: the bug, and the input stages an engine may not dump
    "linear_decay": ("decay_from_a_log_as_stored", ("a_softplus",)),
    "conv_state": ("conv_kernel_reversed", ("linear_attn_qkv_mixed",)),
    "qk_not_l2_normed": ("qk_not_l2_normed", ("q_conv", "k_conv")),
    "attention_output_gate": ("attention_output_gate_missing", ("attn_pregate", "gate_sigmoid", "Qcur_full")),
}


@pytest.mark.parametrize("hint", SPARSE)
def test_a_hybrid_hint_fires_where_the_engine_dumps_none_of_the_stages_inputs(correct, tmp_path, hint):
    """An engine written outside the project dumps another stage set: where MINE lacks a stage's inputs, the hint
    reads REF's (they are upstream of the first divergence, so equal to within the tolerance)."""
    import json

    import refllama.check.bugs as bugs_module

    m, ref = correct("qwen35", False)
    bug_name, inputs = SPARSE[hint]
    changed = inject(getattr(bugs_module, bug_name), ref, tmp_path / "mine", m)
    manifest = json.loads((tmp_path / "mine" / "manifest.json").read_text())
    manifest["tensors"] = [t for t in manifest["tensors"] if t["name"].rsplit("-", 1)[0] not in inputs]
    (tmp_path / "mine" / "manifest.json").write_text(json.dumps(manifest))
    rep = compare(tmp_path / "mine", ref, m)
    assert rep.first is not None and rep.first["name"] in changed, rep.first
    assert hint in rep.hinted, rep.hints
