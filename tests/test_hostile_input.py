"""Hostile model files and chat templates: each finding of the fuzzing report, as a case that must give one clear
line (RefllamaError), never a raw exception, a hang or an allocation the file asked for."""

import json
import os
import shutil
import struct
import threading
import time
from pathlib import Path

import pytest
from fuzzing import GGUF, HOSTILE_TEMPLATES, template_outcome
from tiers import param

import refllama
from refllama.api import default_model_path
from refllama.formats.chat import render

DATA = Path(__file__).parent / "data"
TINY = DATA / "gguf-llama" / "llama-q8_0.gguf"


def expect_error(path, *fragments, **load):
    with pytest.raises(refllama.RefllamaError) as e:
        refllama.load(path, **load)
    msg = str(e.value)
    assert "\n" not in msg and "\x1b" not in msg, msg
    for f in fragments:
        assert f in msg, msg
    return msg


def edited(tmp_path, edit, source=TINY):
    """A copy of the tiny GGUF with edit(GGUF) applied."""
    g = GGUF(Path(source).read_bytes())
    edit(g)
    path = tmp_path / "edited.gguf"
    g.write(path)
    return path


def set_field(key, value, vtype=4):
    def edit(g):
        g.kv = [kv for kv in g.kv if kv[0] != key] + [[key, vtype, value, None]]
    return edit


@pytest.mark.parametrize("key, value, vtype, fragment", [
    ("llama.attention.head_count", 0, 4, "outside [1,"),
    ("general.alignment", 0, 4, "general.alignment"),
    ("general.alignment", 3, 4, "not a power of two"),
    ("general.alignment", "32", 8, "must be an integer, got a string"),
    ("llama.block_count", 0, 4, "llama.block_count"),
    ("llama.rope.freq_base", float("nan"), 6, "must be finite"),
    ("llama.attention.layer_norm_rms_epsilon", -1.0, 6, "positive"),
    ("llama.context_length", "4096", 8, "must be an integer"),
    ("llama.rope.dimension_count", 64, 4, "rope dimension 64 must be even and at most the head dimension 16"),
    ("llama.attention.head_count_kv", 3, 4, "do not divide"),
    ("tokenizer.ggml.eos_token_id", 320, 4, "outside [0, 319]"),
    ("tokenizer.ggml.add_bos_token", 1, 4, "must be a bool"),
    ("general.architecture", "llama\nfake: \x1b[31mred", 8, "'llama\\nfake: \\x1b[31mred'"),
])
def test_bad_metadata_values_are_named(tmp_path, key, value, vtype, fragment):
    expect_error(edited(tmp_path, set_field(key, value, vtype)), "edited.gguf", fragment)


def test_duplicate_keys_and_tensors_are_refused(tmp_path):
    expect_error(edited(tmp_path, lambda g: g.kv.insert(3, list(g.kv[3]))), "duplicate metadata key")
    expect_error(edited(tmp_path, lambda g: g.tensors.insert(1, list(g.tensors[1]))), "duplicate tensor")


def test_tensor_data_must_be_aligned_inside_and_not_overlapping(tmp_path):
    def shift(by):
        def edit(g):
            g.tensors[2][3] += by
        return edit
    expect_error(edited(tmp_path, shift(1)), "not aligned")
    expect_error(edited(tmp_path, shift(-32)), "overlaps")
    expect_error(edited(tmp_path, shift(1 << 40)), "ends past the end of the file")


@pytest.mark.parametrize("n_dims", [5, 2 ** 31, 0])
def test_a_corrupt_n_dims_is_refused_at_once_even_on_the_default_model(tmp_path, n_dims):
    src = default_model_path()
    with open(src, "rb") as f:
        g = GGUF(f.read(8 << 20))
    g.tensors[10][4] = n_dims
    path = tmp_path / "nd.gguf"
    g.write(path, sparse_to=os.path.getsize(src) - g.data_start)  # same size, data a hole
    t = time.perf_counter()
    expect_error(path, "dimensions (1 to 4 allowed)")
    assert time.perf_counter() - t < 5  # the bug took 12.7 s and 773 MB; a check before reading takes ~0.3 s


def test_counts_that_the_file_cannot_hold_are_refused_before_reading(tmp_path):
    def edit(g):
        g.counts = (len(g.tensors), 2 ** 40)
    expect_error(edited(tmp_path, edit), "more than a file of")


def test_token_type_longer_than_tokens(tmp_path):
    def edit(g):
        kv = next(kv for kv in g.kv if kv[0] == "tokenizer.ggml.token_type")
        kv[2] = kv[2] + [1, 1]
    expect_error(edited(tmp_path, edit), "token_type has 322 entries for 320 tokens")


def test_merges_of_missing_tokens_load_as_in_llamacpp(tmp_path):
    """llama.cpp does not check merges against the vocabulary: a piece no token spells falls back to the tokens of
    its bytes, and bytes with none are dropped (here the space, spelled "Ġ", whose token was renamed)."""
    def edit(g):
        kv = next(kv for kv in g.kv if kv[0] == "tokenizer.ggml.tokens")
        kv[2] = [t if t != "Ġ" else "Q\x01" for t in kv[2]]
    m = refllama.load(edited(tmp_path, edit))
    assert m.tokenize(" ", add_special=False) == []
    assert m.tokenize("a", add_special=False) != []


def test_a_k_quant_row_that_is_not_whole_blocks(tmp_path):
    def edit(g):
        t = next(t for t in g.tensors if t[0] == "blk.0.ffn_up.weight")
        t[2] = 12  # Q4_K: 256-value blocks, rows of 64
    expect_error(edited(tmp_path, edit), "not a multiple of its block of 256")


def test_a_context_length_of_2_31_asks_for_memory_the_machine_lacks(tmp_path):
    path = edited(tmp_path, set_field("llama.context_length", 2 ** 31))
    assert refllama.load(path).n_ctx == 4096  # the API's default context is not the model's
    msg = expect_error(path, "a KV cache of 2147483648 positions needs", "-c", n_ctx=0)
    assert "GiB" in msg


# ---------------------------------------------------------------- HF directories

def hf_copy(tmp_path, name="tiny-llama"):
    d = tmp_path / name
    shutil.copytree(DATA / name, d)
    return d


def edit_json(path, edit):
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))


@pytest.mark.parametrize("text, fragment", [
    ("[]", "expected a JSON object"), ('{"a": NaN}', "NaN is not JSON"), ("[" * 5000 + "]" * 5000, "invalid JSON"),
    ('{"x": ' + "9" * 5000 + "}", "a number of 5000 digits"), ('{"hidden_size": "\\ud800"}', "lone surrogate"),
])
def test_config_json_shape_and_limits(tmp_path, text, fragment):
    d = hf_copy(tmp_path)
    (d / "config.json").write_text(text)
    expect_error(d, "config.json", fragment)


@pytest.mark.parametrize("key, value, fragment", [
    ("rope_parameters", "linear", "field 'rope_parameters' has the wrong type"),
    ("num_attention_heads", 0, "must be at least 1"),
    ("num_key_value_heads", 3, "do not divide"),
    ("rms_norm_eps", -1e-5, "rms_eps must be a finite positive number"),
    ("tie_word_embeddings", "yes", "tie_word_embeddings"),
    ("partial_rotary_factor", 2 ** 31, "must be in (0, 1]"),  # once sized a 256 GiB RoPE table
    ("head_dim", 2 ** 40, "has shape"),  # the weights bound it before anything is sized by it
])
def test_config_values_are_validated(tmp_path, key, value, fragment):
    d = hf_copy(tmp_path)
    edit_json(d / "config.json", lambda c: {**c, key: value})
    expect_error(d, fragment)


def test_an_int_eos_token_in_tokenizer_config(tmp_path):
    from refllama.formats.tokenizer import from_hf_dir

    d = hf_copy(tmp_path)
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": 2}))
    (d / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0},
                                                                               "merges": []}}))
    with pytest.raises(refllama.RefllamaError, match="field 'eos_token' must be a string"):
        from_hf_dir(d)


@pytest.mark.parametrize("edit, fragment", [
    (lambda e: e.update(data_offsets=None), "not a valid safetensors file"),
    (lambda e: e.update(data_offsets=[0, 4, 8]), "not a valid safetensors file"),
    (lambda e: e.update(shape=[3]), "not a valid safetensors file"),
])
def test_safetensors_headers_follow_the_format(tmp_path, edit, fragment):
    d = hf_copy(tmp_path)
    raw = (d / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    edit(header[next(k for k in header if k != "__metadata__")])
    body = json.dumps(header).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n:])
    expect_error(d, "model.safetensors", fragment)


def test_a_header_length_off_by_one_into_the_padding_is_refused(tmp_path):
    d = hf_copy(tmp_path)
    raw = bytearray((d / "model.safetensors").read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    assert raw[8 + n - 1:8 + n] == b" "  # the header is padded with spaces: one byte less still parses
    raw[:8] = struct.pack("<Q", n - 1)
    (d / "model.safetensors").write_bytes(bytes(raw))
    expect_error(d, "not fully covered")


def sharded(tmp_path, target):
    d = hf_copy(tmp_path)
    (d / "model.safetensors").rename(d / "model-1.safetensors")
    raw = (d / "model-1.safetensors").read_bytes()
    names = [k for k in json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]]) if k != "__metadata__"]
    weight_map = {k: "model-1.safetensors" for k in names} | {names[0]: target}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return d


@pytest.mark.parametrize("target, fragment", [
    ("/etc/passwd", "leaves the model directory"), ("../outside.safetensors", "leaves the model directory"),
    ("sub/../../x", "leaves the model directory"), ("link/model.safetensors", "link out of the model directory"),
    ("fifo", "not a regular file"), ("dir", "not a regular file"), (7, "must map tensor names to file names"),
    ("loop", "cannot be resolved"),
])
def test_shard_names_stay_inside_the_directory_and_are_regular_files(tmp_path, target, fragment):
    d = sharded(tmp_path, target)
    os.mkfifo(d / "fifo")
    (d / "dir").mkdir()
    os.symlink(DATA / "tiny-qwen2", d / "link")
    os.symlink("loop", d / "loop")  # a link to itself
    done = []
    t = threading.Thread(target=lambda: done.append(expect_error(d, fragment)), daemon=True)
    t.start()
    t.join(20)  # a FIFO opened for reading blocks until a writer comes: it must never be opened
    assert done, f"loading hung on shard {target!r}"


def test_an_untied_config_without_the_output_weight_is_refused_at_load(tmp_path):
    d = hf_copy(tmp_path)
    config = json.loads((d / "config.json").read_text())
    assert config.get("tie_word_embeddings") is not False  # the tiny Qwen2 ties its head: untie it, keep no lm_head
    (d / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    expect_error(d, "lm_head.weight")


def test_a_directory_where_config_json_belongs(tmp_path):
    d = hf_copy(tmp_path)
    (d / "generation_config.json").unlink()
    (d / "generation_config.json").mkdir()
    expect_error(d, "generation_config.json: not a regular file")


# ---------------------------------------------------------------- chat templates

@pytest.mark.parametrize("template", [param(t, fast=i < 6, id=str(i)) for i, t in enumerate(HOSTILE_TEMPLATES)])
def test_hostile_templates_end_in_text_or_one_clear_error(template):
    t = time.perf_counter()
    assert template_outcome(template, timeout=1.0) in ("rendered", "refused")
    assert time.perf_counter() - t < 10  # the time limit holds (a nested loop ran for hours)


def test_a_template_stopped_by_its_cpu_limit_reports_the_time_limit(monkeypatch):
    """On a busy machine the renderer's CPU-time limit (SIGXCPU) can end it before the parent's wall clock does: the
    message is the same time limit, not "the renderer died"."""
    import signal
    import subprocess

    from refllama.formats import chat

    killed = subprocess.CompletedProcess([], -signal.SIGXCPU, b"", b"")
    monkeypatch.setattr(chat.subprocess, "run", lambda *a, **k: killed)
    with pytest.raises(refllama.RefllamaError, match=r"^m\.gguf: chat template failed: it ran longer than 1 s$"):
        render("{{ 1 }}", [], source="m.gguf", timeout=1.0)


def test_a_template_error_names_the_model_and_the_cause():
    with pytest.raises(refllama.RefllamaError, match=r"^m\.gguf: chat template failed: .*ran longer than 1 s"):
        render(HOSTILE_TEMPLATES[0], [], source="m.gguf", timeout=1.0)
    with pytest.raises(refllama.RefllamaError, match="renders more than 1000 characters"):
        render("{% for i in range(2000) %}x{% endfor %}", [], max_chars=1000)
    with pytest.raises(refllama.RefllamaError, match="TypeError: no loader"):
        render("{% include 'other' %}", [])
    assert render("{{ bos_token }}{{ messages[0].content }}", [{"role": "user", "content": "hi"}], "<s>") == "<s>hi"
