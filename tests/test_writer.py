"""refllama.check.DumpWriter and torch_hooks: an engine's dump in a few lines, its names checked as they are added,
compared with refllama's own dump of the same tokens."""

from pathlib import Path

import numpy as np
import pytest

import refllama
from refllama.check import DumpWriter, torch_hooks
from refllama.check.compare import compare
from refllama.errors import RefllamaError

DATA = Path(__file__).parent / "data"
GGUF = DATA / "gguf-llama" / "llama-f32.gguf"
IDS = [3, 17, 9, 42, 5]


def test_an_engines_stages_written_with_the_writer_pass_compare(tmp_path):
    """Stages traced from refllama (standing in for an engine), added one by one with a decode step: the dump
    compares clean against refllama's own, every stage re-run."""
    m = refllama.load(GGUF, n_ctx=32)
    with refllama.trace(m) as t:
        logits = m.logits(IDS)
    nxt = int(logits[-1].argmax())
    with refllama.trace(m) as step:
        m.forward([nxt], len(IDS))
    with DumpWriter(tmp_path / "mine", IDS, arch="llama", qk_layout=m.config.rope_layout, model=str(GGUF)) as w:
        for name, x in t.items():
            w.add(name, x)
        w.decode_step(nxt)
        for name, x in step.items():
            w.add(name, x)
    ref = m.dump(IDS, tmp_path / "ref", decode_ids=[nxt])
    rep = compare(tmp_path / "mine", ref, m)
    assert rep.first is None and len(rep.rows) == len(dict(t)), rep.first  # a stage's records: one row
    assert any("decode positions 5" in line for line in rep.coverage)


@pytest.mark.parametrize("name, words", [
    ("attn-norm-0", "'attn-norm-0' is no stage of llama (did you mean 'attn_norm'?)"),
    ("attn_norm", "a block's stage: name its layer, attn_norm-N"),
    ("result_norm-3", "a stage outside the blocks: no layer suffix"),
    ("Qcur-0", "q/k stages need the qk_layout"),
])
def test_a_wrong_name_fails_where_it_is_added_and_nothing_is_written(tmp_path, name, words):
    with pytest.raises(RefllamaError) as e:
        with DumpWriter(tmp_path / "mine", IDS) as w:
            w.add("inp_embd", np.zeros((5, 8), np.float32))
            w.add(name, np.zeros((5, 8), np.float32))
    assert words in str(e.value)
    assert not (tmp_path / "mine").exists() and not list(tmp_path.iterdir())


def test_an_unknown_architecture_is_refused_at_once_with_the_known_names(tmp_path):
    with pytest.raises(RefllamaError, match=r"'arch' 'qwen3_moe' is no architecture refllama knows .*qwen3moe"):
        DumpWriter(tmp_path / "mine", IDS, arch="qwen3_moe")
    assert not list(tmp_path.iterdir())


def test_torch_hooks_dump_a_pytorch_model_by_module_name(tmp_path):
    """transformers' Llama, hooked by module name with `{i}` for the layer: its stages compare clean against
    refllama's (within the float32 bands)."""
    torch = pytest.importorskip("torch", reason="torch is not installed (a PyTorch engine's helper)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    d = DATA / "tiny-llama"
    hf = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    with DumpWriter(tmp_path / "mine", IDS, arch="llama", model=str(d), producer="transformers") as w:
        handles = torch_hooks(hf, {"model.embed_tokens": "inp_embd",
                                   "model.layers.{i}.input_layernorm": "attn_norm-{i}",
                                   "model.layers.{i}.mlp": "ffn_out-{i}", "model.layers.{i}": "l_out-{i}",
                                   "model.norm": "result_norm", "lm_head": "result_output"}, w)
        with torch.no_grad():
            hf(torch.tensor([IDS]))
        for h in handles:
            h.remove()
    m = refllama.load(d, n_ctx=32)
    rep = compare(tmp_path / "mine", m.dump(IDS, tmp_path / "ref"), m)
    n = m.config.n_layer
    assert rep.first is None and len(rep.rows) == 3 + 3 * n, (rep.first, len(rep.rows))


def test_overwrite_replaces_a_dump_once_the_new_one_is_complete_and_nothing_else(tmp_path):
    def write(value, **kw):
        with DumpWriter(tmp_path / "mine", IDS, **kw) as w:
            w.add("inp_embd", np.full((5, 8), value, np.float32))

    write(1.0)
    with pytest.raises(RefllamaError, match="overwrite=True replaces a dump there"):
        write(2.0)
    with pytest.raises(RefllamaError, match="boom"):  # a failed run leaves the old dump as it was
        with DumpWriter(tmp_path / "mine", IDS, overwrite=True) as w:
            w.add("inp_embd", np.full((5, 8), 3.0, np.float32))
            raise RefllamaError("boom")
    assert np.load(tmp_path / "mine" / "inp_embd.npy")[0, 0] == 1.0
    write(2.0, overwrite=True)
    assert np.load(tmp_path / "mine" / "inp_embd.npy")[0, 0] == 2.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no temporary left beside it
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(RefllamaError, match="is no dump: overwrite replaces only a dump"):
        with DumpWriter(tmp_path / "other", IDS, overwrite=True) as w:
            w.add("inp_embd", np.zeros((5, 8), np.float32))
    assert (tmp_path / "other" / "notes.txt").exists()
