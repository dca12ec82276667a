"""The harness on another engine: tests/engine.py (its own NumPy Llama, HF-ordered q/k, its own dump writer) run
clean and with the bugs engine authors make. The clean engine must pass; each bug must be named at its own stage
by the commands README shows: refllama's dump of the same tokens, then `python -m refllama.compare MINE REF`.
"""

import json
import subprocess
import sys

import pytest
from engine import Engine, Weights

from refllama.api import default_model_path
from refllama.check.compare import compare
from refllama.check.dump import Dump

pytestmark = pytest.mark.slow  # SmolLM2's 30 layers dumped and compared once a bug, ~5 s each

PROMPT = "The quick brown fox jumps over"
DECODE_STEPS = 2
BUGS = {  # bug: (the stage it must be named at, words of the hint that must explain it)
    "pair_layout": ("Qcur_rope-0", "rotating the wrong pairs"),
    "eps": ("attn_norm-0", "eps 1e-06"),
    "gqa": ("kq-0", "read with kv head h % 3: grouped-query attention pairs it with kv head h // 3"),
    "softmax_scale": ("kq_soft_max-0", "= 1/HD); the model's scale"),
    "theta": ("Qcur_rope-0", "matches RoPE with base 500000; the model's base is 100000"),
    "gelu": ("ffn_swiglu-0", "gelu_tanh(ffn_gate)"),
    "bf16_residual": ("ffn_inp-0", "rounded to bfloat16"),
    "swap_gate_up_7": ("ffn_gate-7", "equals the expected ffn_up-7"),
    "decode_position": ("Qcur_rope-0", "decode steps' (6-7) are not"),
    "no_causal_mask": ("kq_soft_max-0", "causal mask is missing"),
    "mask_off_by_one": ("kq_soft_max-0", "each query also sees the key after its own"),
    "neighbour_layer_7": ("attn_norm-7", "computed with block 8's weights: layer 7 reads its neighbour's tensors"),
    "no_final_norm": ("result_norm", "equals its input (l_out-29): the norm (output_norm) is skipped"),
    "no_attn_residual_5": ("ffn_inp-5", "equals attn_out-5 alone: the residual is not added"),
    "manifest_layout": ("Qcur-0", "the manifest's qk_layout (the layout of the values dumped) should say 'half'"),
    "unpermuted_weights": ("Qcur-0", "kq-0 is wrong: the engine's attn_q/attn_k rows are in the 'interleaved' "
                           "layout where its RoPE pairs 'half'"),
}


@pytest.fixture(scope="module")
def weights():
    return Weights(default_model_path())


def run_engine(weights, model, tmp_path, bugs=(), numerics="float32", form="directory"):
    """The engine's dump and refllama's dump of the same tokens (as `--tokens-from MINE` makes it)."""
    suffix = ".safetensors" if form == "safetensors" else ""
    mine = Engine(weights, bugs, numerics).dump(model.tokenize(PROMPT), tmp_path / f"mine{suffix}", DECODE_STEPS, form)
    d = Dump(mine)
    return mine, model.dump(d.prompt_ids, tmp_path / "ref", decode_ids=d.decode_ids)


def test_the_clean_engine_passes_with_the_readme_commands(weights, model, tmp_path):
    mine = Engine(weights).dump(model.tokenize(PROMPT), tmp_path / "mine", DECODE_STEPS)
    ref = tmp_path / "ref"
    r = subprocess.run([sys.executable, "-m", "refllama.run", "--dump-dir", str(ref), "--tokens-from", str(mine),
                        "-n", "0"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((ref / "manifest.json").read_text())  # the ids' origin, not the default prompt
    assert manifest["tokens_from"] == str(mine.resolve()) and manifest["prompt"] == Dump(mine).manifest.get("prompt")
    r = subprocess.run([sys.executable, "-m", "refllama.compare", str(mine), str(ref)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "tolerance: float32" in r.stdout and "within tolerance" in r.stdout
    assert "decode positions 6-7" in r.stdout  # the decode steps were compared
    assert "compared: 513 stages in 30 layers (0-29)" in r.stdout


@pytest.mark.parametrize("bug", list(BUGS))
def test_each_bug_is_named_at_its_stage(weights, model, tmp_path, bug):
    stage, hint = BUGS[bug]
    mine, ref = run_engine(weights, model, tmp_path, [bug])
    rep = compare(mine, ref, model)
    assert rep.first is not None and rep.first["name"] == stage, rep.first
    assert rep.first["adds"] == ["MINE"]
    assert any(hint in line for line in rep.where + rep.hints), rep.where + rep.hints
    e2e = compare(mine, ref, None).first  # without the model: end to end only, still the same stage
    assert e2e is not None and e2e["name"] == stage, e2e


def test_a_mixed_precision_engine_passes_once_it_declares_its_precision(weights, model, tmp_path):
    """float32, but float16 embedding rows and KV cache: undeclared, compare stops at inp_embd and proposes the map
    (not a blanket float16); declared, every stage passes, each re-run in that precision."""
    ids = model.tokenize(PROMPT)
    mine = Engine(weights, half="undeclared").dump(ids, tmp_path / "mine", DECODE_STEPS)
    d = Dump(mine)
    ref = model.dump(d.prompt_ids, tmp_path / "ref", decode_ids=d.decode_ids)
    rep = compare(mine, ref, model)
    assert rep.first["name"] == "inp_embd", rep.first
    assert any('"rounded": {"inp_embd": "float16"}' in n for n in rep.notes), rep.notes
    assert any('"rounded": {"inp_embd": "float16"}' in h for h in rep.hints), rep.hints
    declared = Engine(weights, half="declared").dump(ids, tmp_path / "declared", DECODE_STEPS)
    rep = compare(declared, ref, model)
    assert rep.first is None, rep.first
    assert not [n for n in rep.notes if "rounded" in n]


def test_an_undeclared_float16_kv_cache_is_named(weights, model, tmp_path):
    """Embedding rows declared rounded, the float16 KV cache not: named where its rounding shows first, and the
    rounding re-run there."""
    mine = Engine(weights, half="declared").dump(model.tokenize(PROMPT), tmp_path / "mine", DECODE_STEPS)
    manifest = json.loads((mine / "manifest.json").read_text())
    del manifest["kv_cache"]
    (mine / "manifest.json").write_text(json.dumps(manifest))
    d = Dump(mine)
    rep = compare(mine, model.dump(d.prompt_ids, tmp_path / "ref", decode_ids=d.decode_ids), model)
    assert rep.first["name"] in ("kq-0", "kqv_out-0"), rep.first  # the keys' rounding, or the values'
    assert any('a float16 KV cache; declare it: "kv_cache": "float16"' in h for h in rep.hints), rep.hints


@pytest.mark.parametrize("bug", ["eps", "theta", "mask_off_by_one", "neighbour_layer_7", "no_final_norm",
                                 "no_attn_residual_5", "manifest_layout"])
def test_each_bug_is_named_with_the_engines_mixed_precision_declared(weights, model, tmp_path, bug):
    """The precision declared bands nothing wider than its own rounding: a float32-sized bug still shows (the
    issue's eps and theta bugs, its four, and the layout hint whose kq check reads the float16 cache; the rest of
    BUGS passed so too when checked: 16 of 16)."""
    stage, hint = BUGS[bug]
    ids = model.tokenize(PROMPT)
    mine = Engine(weights, [bug], half="declared").dump(ids, tmp_path / "mine", DECODE_STEPS)
    d = Dump(mine)
    rep = compare(mine, model.dump(d.prompt_ids, tmp_path / "ref", decode_ids=d.decode_ids), model)
    assert rep.first is not None and rep.first["name"] == stage, rep.first
    assert any(hint in line for line in rep.where + rep.hints), rep.where + rep.hints


def test_a_decode_step_bug_is_named_by_the_cli(weights, model, tmp_path):
    mine, ref = run_engine(weights, model, tmp_path, ["decode_position"])
    r = subprocess.run([sys.executable, "-m", "refllama.compare", str(mine), str(ref), "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert '"first_divergence": "Qcur_rope-0"' in r.stdout


def test_a_bfloat16_engine_in_one_safetensors_file(weights, model, tmp_path):
    """bfloat16 tensors, a batch axis, q/k/v as [1, T, H*HD], the manifest in the metadata header: a correct
    bfloat16 engine passes on its rounding's bands; the same engine with a bug fails at the bug's stage."""
    mine, ref = run_engine(weights, model, tmp_path / "clean", numerics="bfloat16", form="safetensors")
    rep = compare(mine, ref, model)
    assert rep.first is None and rep.column.name == "bfloat16", rep.first
    for bug in ("gelu", "gqa"):
        mine, ref = run_engine(weights, model, tmp_path / bug, [bug], "bfloat16", "safetensors")
        first = compare(mine, ref, model).first
        assert first is not None and first["name"] == BUGS[bug][0], first


def test_the_float32_bands_catch_what_bfloat16_hides(weights, model, tmp_path):
    """The same bfloat16 engine, read as if it computed in float32, fails at once: the column matters."""
    mine, ref = run_engine(weights, model, tmp_path, numerics="bfloat16", form="safetensors")
    rep = compare(mine, ref, model, numerics="float32")
    assert rep.column.name == "float32" and rep.first is not None
    assert any("rounded to bfloat16" in h for h in rep.hints), rep.hints
