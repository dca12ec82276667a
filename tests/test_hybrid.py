"""The hybrids (Qwen3.5, Qwen3.5-MoE, Qwen3-Next): linear attention's recurrent state in the unified cache (a prompt
in pieces, then decode steps, equals one prefill; a sequence from position 0 starts from a zero state), HF's weights
turned into llama.cpp's at load (grouped v heads tiled, A_log, the norms, Qwen3-Next's fused q/k/v/z regrouped), the
v head orders a dump may declare (the GPU placement's float32 arithmetic on NumPy: tests/test_gpu.py)."""

import numpy as np
import pytest
from families import GGUF, names

import refllama
from refllama.pairs import V_HEAD_STAGES, reorder_v_heads, tiled_order

HYBRIDS = names(recurrent=True)
N_CTX = 64


def rel(got, want):  # max abs error over the reference's range
    return float(np.abs(np.asarray(got) - want).max() / np.ptp(want))


@pytest.mark.parametrize("family", HYBRIDS)
def test_a_prompt_in_pieces_then_decode_steps_equals_one_prefill(family):
    """The conv's last inputs and the delta state carried between calls: 5 tokens, then 4 in one batch, then 3
    decode steps give the logits of one prefill of the 12 (float32: within 1e-5 of their range)."""
    m = refllama.load(GGUF[family].gguf(), n_ctx=N_CTX)
    ids = list(range(3, 15))
    whole = m.logits(ids)
    m.cache.reset()
    parts = [m.forward(ids[:5], 0), m.forward(ids[5:9], 5)] + [m.forward([t], 9 + k) for k, t in enumerate(ids[9:])]
    assert rel(np.concatenate(parts), whole) < 1e-5


@pytest.mark.parametrize("family", HYBRIDS)
def test_a_sequence_from_position_0_starts_from_a_zero_state(family):
    """A prompt run after another one, from position 0 without a reset (as a server's next request), equals it run
    on a fresh model: no state of the first sequence leaks into the second."""
    fresh = refllama.load(GGUF[family].gguf(), n_ctx=N_CTX).logits([7, 8, 9, 10])
    m = refllama.load(GGUF[family].gguf(), n_ctx=N_CTX)
    m.forward([40, 41, 42], 0)
    m.cache.n_past = 0  # no reset: the buffers still hold the first sequence's state
    np.testing.assert_array_equal(m.forward([7, 8, 9, 10], 0), fresh)


@pytest.mark.parametrize("family", names(recurrent=True, hf_model=True))
def test_hf_weights_load_as_llamacpps_converter_writes_them(family):
    """Every tensor read from the HF directory equals the one read from llama.cpp's F32 file: v heads reordered
    from grouped to tiled where the file has them so (Qwen3.5's), A_log to -exp(A_log), (1 + w) norms, the conv's
    unit axis, Qwen3-Next's q/k/v/z regrouped and split."""
    hf, gg = refllama.load(GGUF[family].dir / "hf-model"), refllama.load(GGUF[family].gguf())
    assert hf.config.linear_v_order == gg.config.linear_v_order
    for i, (a, b) in enumerate(zip(hf.weights["layers"], gg.weights["layers"], strict=True)):
        assert sorted(a) == sorted(b), i
        for key in a:
            if not isinstance(a[key], tuple):  # the experts: as every MoE family's
                np.testing.assert_allclose(a[key], b[key], rtol=1e-6, atol=0, err_msg=f"layer {i} {key}")


def test_the_tiled_order_is_the_converters():
    """tiled_order reproduces llama.cpp's converter (_reorder_v_heads: a [k head, v head of it, unit] reshape with
    its first two axes swapped), and reorder_v_heads inverts itself on every kind of stage."""
    n_k, n_v, unit = 2, 6, 3
    rows = np.arange(n_v * unit)
    converter = rows.reshape(n_k, n_v // n_k, unit).transpose(1, 0, 2).reshape(-1)
    np.testing.assert_array_equal(tiled_order(n_v * unit, 0, unit, n_k, n_v), converter)
    shapes = {"heads": (5, n_v, 4), "units": (5, n_v), "flat": (5, n_v * 4), "qkv": (5, (2 * n_k + n_v) * 4)}
    for stage, form in V_HEAD_STAGES.items():
        a = np.random.default_rng(0).standard_normal(shapes[form])
        there = reorder_v_heads(stage, a, n_k, n_v)
        assert not np.array_equal(there, a)
        np.testing.assert_array_equal(reorder_v_heads(stage, there, n_k, n_v, to="grouped"), a)


@pytest.mark.parametrize("family", ["qwen35", "qwen35moe"])
def test_a_multimodal_checkpoint_loads_its_text_model(family, tmp_path):
    """Qwen3.5's released checkpoints are Qwen3_5ForConditionalGeneration (Qwen3_5MoeFor...): the text model's
    config nested as `text_config`, its tensors under `model.language_model.` beside `model.visual.*` (transformers'
    Qwen3_5Model): read as the same text model, the vision tower left unread."""
    import json
    import shutil

    from safetensors.numpy import load_file, save_file

    src = GGUF[family].dir / "hf-model"
    d = tmp_path / "mm"
    shutil.copytree(src, d)
    text = json.loads((src / "config.json").read_text())
    kind = text["architectures"][0].replace("ForCausalLM", "ForConditionalGeneration")
    (d / "config.json").write_text(json.dumps({"architectures": [kind], "text_config": text, "vision_config": {},
                                               "tie_word_embeddings": text["tie_word_embeddings"]}))
    tensors = {(n.replace("model.", "model.language_model.", 1) if n.startswith("model.") else n): a
               for n, a in load_file(src / "model.safetensors").items()}
    save_file({**tensors, "model.visual.patch_embed.proj.weight": np.zeros((4, 4), np.float32)},
              d / "model.safetensors")
    ids = [1, 5, 9, 2, 7]
    np.testing.assert_array_equal(refllama.load(d).logits(ids), refllama.load(src).logits(ids))


@pytest.mark.parametrize("family", HYBRIDS)
def test_a_bfloat16_hf_directory_computes_its_float32_values(family, tmp_path):
    """The released checkpoints are bfloat16: a matrix kept as stored has its bytes' rows reordered (v heads tiled,
    Qwen3-Next's q/k/v/z regrouped), one whose columns move (out_proj) or whose values change (A_log, the norms) is
    converted first; the logits equal those of the same bfloat16 values widened to float32."""
    import json
    import shutil

    from engine import bf16, write_safetensors_bf16
    from safetensors.numpy import load_file, save_file

    src = GGUF[family].dir / "hf-model"
    tensors = load_file(src / "model.safetensors")
    kept, widened = tmp_path / "bf16", tmp_path / "f32"
    for d in (kept, widened):
        shutil.copytree(src, d)
    write_safetensors_bf16(kept / "model.safetensors", tensors, {"format": "pt"})
    save_file({n: bf16(a) for n, a in tensors.items()}, widened / "model.safetensors")
    assert json.loads((kept / "config.json").read_text())["architectures"]
    ids = [1, 5, 9, 2, 7, 3]
    np.testing.assert_allclose(refllama.load(kept).logits(ids), refllama.load(widened).logits(ids), rtol=0, atol=1e-5)
