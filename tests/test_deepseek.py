"""DeepSeek-V3's architecture (deepseek2: multi-head latent attention, grouped sigmoid routing) and GLM-4.5 (glm4moe):
the two forms of latent attention, what each caches, the readings of their files and configs, their routing, and the
harness's hints for their porting bugs. The references themselves (logits, every stage of both references, the
Q8_0 files' bits on four CPU paths) are checked by the family-parametrized tests (tests/families.py)."""

import json
import shutil

import numpy as np
import pytest
from families import DATA
from tiers import param

import refllama
from refllama import arch
from refllama.cache import Cache
from refllama.check import bugs
from refllama.check.bugs import inject
from refllama.check.compare import compare
from refllama.formats.gguf_loader import Field, GGUFFile

N_CTX = 64
IDS = list(range(3, 14))


def gguf(family, qtype="f32"):
    return DATA / f"gguf-{family}" / f"{family}-{qtype}.gguf"


def ref(family):
    return np.load(DATA / f"gguf-{family}" / "reference.npz")


def rel_err(a, b):
    return float(np.abs(a - b).max() / (b.max() - b.min()))


@pytest.mark.parametrize("family", ["deepseek3", "moonlight"])
def test_the_absorbed_form_computes_the_papers_attention(family):
    """llama.cpp's absorbed MLA (k_b folded into q, v_b after the mix, the latent cached) is the paper's expanded
    form re-associated: in float32 both give one model's logits, to float32 rounding; and neither is the other's
    stage set (kv only expanded, q_nope_absorbed only absorbed)."""
    m = refllama.load(gguf(family), n_ctx=N_CTX)
    with refllama.trace(m) as expanded:
        want = m.logits(IDS)
    m.ops = m.ops._replace(mla_absorbed=True)
    m.cache = Cache(m.config, N_CTX, m.ops)
    with refllama.trace(m) as absorbed:
        got = m.logits(IDS)
    assert rel_err(got, want) < 1e-5 and not np.array_equal(got, want)
    assert "kv-0" in expanded and "kv-0" not in absorbed
    assert "q_nope_absorbed-0" in absorbed and "q_nope_absorbed-0" not in expanded
    for stage in ("kq-0", "kq_soft_max-0", "kqv_out-0", "attn_out-0"):  # the stages both forms share
        assert rel_err(absorbed[stage], expanded[stage]) < 1e-5, stage
    ids = ref(family)["token_ids"].tolist()
    assert rel_err(m.logits(ids), ref(family)["llamacpp_logits_f32"]) < 1e-5


def test_each_numerics_caches_its_form_and_counts_it():
    """numerics ggml caches one head of the latent and k_pe a position (KL + R, V its first KL columns), as llama.cpp
    does; float32 every head's k and v. The cache's bytes are what is allocated."""
    cfg = refllama.load(gguf("deepseek3"), n_ctx=N_CTX).config
    latent = refllama.load(gguf("deepseek3", "q8_0"), numerics="ggml", n_ctx=N_CTX).cache
    heads = refllama.load(gguf("deepseek3"), n_ctx=N_CTX).cache
    assert latent.k[0].shape == (1, N_CTX, cfg.kv_lora_rank + cfg.rope_dim) and latent.v[0] is None
    assert heads.k[0].shape == (cfg.n_head, N_CTX, cfg.head_dim)
    assert heads.v[0].shape == (cfg.n_head, N_CTX, cfg.v_head_dim)
    assert latent.nbytes == cfg.n_layer * N_CTX * (cfg.kv_lora_rank + cfg.rope_dim) * 4
    assert heads.nbytes == cfg.n_layer * N_CTX * cfg.n_head * (cfg.head_dim + cfg.v_head_dim) * 4
    assert latent.nbytes * 4 < heads.nbytes


@pytest.mark.parametrize("family", ["deepseek3", "moonlight", "glm45"])
@pytest.mark.parametrize("backend", ["numpy", param("numba", fast=False)])
def test_decode_after_prefill_equals_one_prefill_in_llamacpps_arithmetic(family, backend):
    """The latent (and GLM's KV) cache carries the prefill into the decode steps: bit for bit in numerics ggml."""
    path = gguf(family, "q8_0")
    whole = refllama.load(path, numerics="ggml", backend=backend, n_ctx=N_CTX).logits(IDS)
    m = refllama.load(path, numerics="ggml", backend=backend, n_ctx=N_CTX)
    rows = [np.asarray(m.forward(IDS[:6]))]
    rows += [np.asarray(m.forward([t], 6 + k)) for k, t in enumerate(IDS[6:])]
    np.testing.assert_array_equal(np.vstack(rows), whole)


def test_a_gguf_without_q_lora_rank_has_one_q_projection(tmp_path):
    """DeepSeek-V2-Lite's and Moonlight's files carry no q_lora_rank (llama.cpp requires it but in its 26- and
    27-layer files; the fixture's converter wrote 0): absent and 0 read alike, as attn_q."""
    g = GGUFFile(gguf("moonlight"))
    cfg = arch.deepseek2.config_from_gguf(g)
    del g.fields["deepseek2.attention.q_lora_rank"]
    assert arch.deepseek2.config_from_gguf(g) == cfg and cfg.q_lora_rank == 0
    assert "q_a_norm" not in arch.layer_stages(arch.deepseek2, cfg)[0]
    assert "q_a_norm" in arch.layer_stages(arch.deepseek2, refllama.load(gguf("deepseek3")).config)[0]


def test_yarn_mscale_is_in_the_softmax_scale_not_on_cos_and_sin():
    """DeepSeek's YaRN (mscale_all_dim 1, factor 4): the scale is mscale^2 / sqrt(HD), mscale = 1 + 0.1 ln 4, from the
    GGUF (llama.cpp's float32 arithmetic) and the HF config alike; cos and sin are not scaled."""
    g = refllama.load(gguf("deepseek3"), n_ctx=N_CTX)
    h = refllama.load(DATA / "gguf-deepseek3" / "hf-model", n_ctx=N_CTX)
    mscale = 1 + 0.1 * np.log(4.0)
    for m in (g, h):
        assert m.config.rope_mscale_in_kq
        assert abs(m.config.kq_scale / (mscale ** 2 / np.sqrt(48)) - 1) < 1e-6
        assert abs(float(np.hypot(m.cache.cos[5, 0], m.cache.sin[5, 0])) - 1) < 1e-6


def test_hf_rope_interleave_false_rotates_neox_pairs_and_says_llamacpp_cannot(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(DATA / "gguf-deepseek3" / "hf-model", d)
    c = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**c, "rope_interleave": False}))
    cfg = refllama.load(d, n_ctx=N_CTX).config
    assert cfg.rope_layout == "half" and "rope_interleave is false" in arch.deepseek2.llamacpp_differs(cfg)
    assert arch.deepseek2.llamacpp_differs(refllama.load(DATA / "gguf-deepseek3" / "hf-model").config) is None


@pytest.mark.parametrize("key, value, message", [
    ("deepseek2.expert_gating_func", 3, "unsupported deepseek2.expert_gating_func 3"),
    ("deepseek2.expert_group_count", 3, "8 experts in 3 groups"),
])
def test_routing_refllama_does_not_compute_is_refused_by_field(key, value, message):
    g = GGUFFile(gguf("deepseek3"))
    g.fields[key] = Field(4, False, value)
    with pytest.raises(refllama.RefllamaError, match=message):
        arch.deepseek2.config_from_gguf(g)


def test_glm_reads_the_blocks_before_its_multi_token_prediction_layer():
    """GLM-4.5's released files carry the MTP layer after the last block (nextn_predict_layers 1): not part of the
    forward, not read."""
    g = GGUFFile(gguf("glm45"))
    n = arch.glm4moe.config_from_gguf(g).n_layer
    g.fields["glm4moe.nextn_predict_layers"] = Field(4, False, 1)
    g.fields["glm4moe.block_count"] = Field(4, False, n + 1)
    cfg = arch.glm4moe.config_from_gguf(g)
    assert cfg.n_layer == n and len(cfg.moe_layers) == n


def test_groups_keep_the_best_two_summed():
    """best_groups: each group scored by its two best scores' sum, the best groups kept, the rest at -inf."""
    cfg = refllama.load(gguf("deepseek3"), n_ctx=N_CTX).config  # 8 experts, 4 groups, 2 kept
    scores = np.array([[0.75, 0.0, 0.5, 0.5, 0.5, 0.25, 0.125, 0.125]], np.float32)  # sums .75 1 .75 .25
    with refllama.trace() as t:
        masked = arch.blocks.best_groups(scores, cfg, 0)
    assert t["ffn_moe_group_topk-0"].tolist() == [[1.0, 0.0]]  # ties to the lower group
    assert np.isinf(masked[0, 4:]).all() and (masked[0, :4] == scores[0, :4]).all()


# ---- the harness: each porting bug of these families gets its stage and its hint, on every family that can hold it

BUGS = {  # bug -> the words of its hint
    bugs.softmax_for_sigmoid: "its own sigmoid", bugs.selection_bias_on_the_weights: "added to the weights",
    bugs.selection_bias_not_chosen_by: "before the experts are chosen", bugs.expert_groups_ignored: "groups of experts",
    bugs.routed_scaling_dropped: "routed_scaling_factor", bugs.shared_experts_left_out: "is not added",
    bugs.dense_layer_routed: "are dense", bugs.q_pe_in_the_other_pairs: "rotated in pairs",
    bugs.k_pe_from_the_latents_dims: "the latent's", bugs.softmax_scale_without_mscale: "mscale squared",
}
HELD = {  # the families that hold each (moonlight: no groups, no YaRN; glm45: no latent attention)
    "deepseek3": set(BUGS) - {bugs.selection_bias_not_chosen_by},
    "moonlight": set(BUGS) - {bugs.expert_groups_ignored, bugs.softmax_scale_without_mscale},
    "glm45": set(BUGS) - {bugs.expert_groups_ignored, bugs.softmax_scale_without_mscale, bugs.q_pe_in_the_other_pairs,
                          bugs.k_pe_from_the_latents_dims},
}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    made = {}

    def get(family):
        if family not in made:
            m = refllama.load(gguf(family), n_ctx=N_CTX)
            made[family] = m, m.dump(IDS, tmp_path_factory.mktemp(family) / "ref")
        return made[family]
    return get


@pytest.mark.slow  # test_hints holds each of these hints to its bug in the fast tier, on deepseek3
@pytest.mark.parametrize("family", list(HELD))
@pytest.mark.parametrize("bug", list(BUGS), ids=[b.__name__ for b in BUGS])
def test_each_bug_gets_its_stage_and_hint(dumps, tmp_path, family, bug):
    m, correct = dumps(family)
    changed = inject(bug, correct, tmp_path / "mine", m)
    if bug not in HELD[family]:
        assert changed is None
        return
    assert changed, f"{bug.__name__} changes nothing on {family}"
    rep = compare(tmp_path / "mine", correct, m)
    assert rep.first is not None and rep.first["name"] in changed, rep.first
    assert BUGS[bug] in " ".join(rep.hints), rep.hints


def test_an_engines_latent_stages_dumped_flat_are_read_by_the_models_widths(dumps, tmp_path):
    """An engine may dump q, q_pe, k_pe, kv, ... as [T, n*d]; compare splits each by its own head width (q's HD, q_pe's
    R, kv's NOPE + VD, ...) from the model, and finds the dumps equal."""
    m, correct = dumps("deepseek3")
    shutil.copytree(correct, tmp_path / "mine")
    manifest = json.loads((tmp_path / "mine" / "manifest.json").read_text())
    flat = [t for t in manifest["tensors"] if t["name"].split("-")[0] in ("q", "q_pe", "k_pe", "kv", "q_nope")]
    for t in flat:
        a = np.load(tmp_path / "mine" / f"{t['name']}.npy")
        np.save(tmp_path / "mine" / f"{t['name']}.npy", a.reshape(len(a), -1))
        t.pop("shape", None)
    (tmp_path / "mine" / "manifest.json").write_text(json.dumps(manifest))
    assert flat
    rep = compare(tmp_path / "mine", correct, m)
    assert rep.first is None and {r["stage"] for r in rep.rows} >= {"q", "q_pe", "k_pe", "kv", "q_nope"}



def test_an_hf_mscale_apart_from_mscale_all_dim_is_transformers_and_llamacpp_is_said_to_differ(tmp_path):
    """cos and sin times yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim), as transformers
    and DeepSeek's code; a GGUF cannot carry the ratio, and compare's note says llama.cpp computes another model."""
    d = tmp_path / "m"
    shutil.copytree(DATA / "gguf-deepseek3" / "hf-model", d)
    c = json.loads((d / "config.json").read_text())
    yarn = {**c["rope_parameters"], "mscale_all_dim": 0.8}
    (d / "config.json").write_text(json.dumps({**c, "rope_parameters": yarn}))
    cfg = refllama.load(d, n_ctx=N_CTX).config
    want = (1 + 0.1 * np.log(4.0)) / (1 + 0.1 * 0.8 * np.log(4.0))
    assert abs(cfg.rope_attn_factor / want - 1) < 1e-6
    assert abs(cfg.kq_scale / ((1 + 0.1 * 0.8 * np.log(4.0)) ** 2 / np.sqrt(48)) - 1) < 1e-6
    assert "mscale_all_dim" in arch.deepseek2.llamacpp_differs(cfg)


def test_an_engines_rotated_parts_in_the_other_pair_layout_are_read_by_its_qk_layout(dumps, tmp_path):
    """An engine ported from transformers holds q_pe and k_pe with each rotated pair split in halves (its
    rope_interleave writes them so); with qk_layout "half" declared, compare turns them into the model's pairs and
    finds nothing wrong; declared as the model's, the hint names the other pairs."""
    from refllama.pairs import permute_qk

    m, correct = dumps("deepseek3")
    for declared, wrong in (("half", False), ("interleaved", True)):
        mine = tmp_path / declared
        shutil.copytree(correct, mine)
        manifest = json.loads((mine / "manifest.json").read_text())
        for t in manifest["tensors"]:
            if t["name"].split("-")[0] in ("q_pe", "k_pe"):
                a = np.load(mine / f"{t['name']}.npy")
                np.save(mine / f"{t['name']}.npy", permute_qk(a, "half", a.shape[-1]))
        (mine / "manifest.json").write_text(json.dumps({**manifest, "qk_layout": declared}))
        rep = compare(mine, correct, m)
        assert (rep.first is not None) == wrong, rep.first
        if wrong:
            assert rep.first["stage"] in ("q_pe", "k_pe")
