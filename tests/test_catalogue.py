"""The family catalogue (tests/families.py) against what it describes: the fixtures on disk, the recipes of
tools/make_tiny_gguf.py, and what refllama reads from each file."""

import ast
from pathlib import Path

import pytest
from families import DATA, GGUF, HF

import refllama

TOOLS = Path(__file__).parent.parent / "tools"


def test_every_fixture_has_one_row_and_every_row_its_fixture():
    on_disk = {p.name.removeprefix("gguf-") for p in DATA.glob("gguf-*") if (p / "reference.npz").exists()}
    assert on_disk == set(GGUF)
    assert {p.name.removeprefix("tiny-") for p in DATA.glob("tiny-*") if p.is_dir()} == set(HF)


def test_the_tools_recipes_are_the_catalogues_rows():
    tree = ast.parse((TOOLS / "make_tiny_gguf.py").read_text())
    recipes = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                   and any(getattr(t, "id", None) == "FAMILIES" for t in node.targets))
    assert {k.value for k in recipes.keys} == set(GGUF)


@pytest.mark.parametrize("family", GGUF)
def test_a_rows_features_are_its_files(family):
    f = GGUF[family]
    assert (f.dir / "hf-model").is_dir() == f.hf_model and (f.dir / "llamacpp-q8_0").is_dir() == f.q8_0_stages
    assert f.gguf().exists() and f.gguf("q8_0").exists()
    assert (f.dir / "llamacpp-f32").is_dir() and (f.dir / "hf").is_dir()
    m = refllama.load(f.gguf(), n_ctx=64)
    cfg = m.config
    assert (cfg.arch, cfg.rope_layout) == (f.arch, f.layout)
    assert any(cfg.is_moe(i) for i in range(cfg.n_layer)) == f.experts
    assert bool(cfg.swa_layers and any(cfg.swa_layers)) == f.window
    assert any(cfg.is_nope(i) for i in range(cfg.n_layer)) == f.nope
    assert bool({"ffn_gelu", "ffn_geglu"} & set(m.arch.STAGES)) == f.gelu_table
