"""Cache, prefill/decode and stopping rules of generation, on the real model."""

import numpy as np
import pytest

import refllama
from refllama.api import Model, stream_text
from refllama.arch.blocks import pre_norm_forward as forward


def small_context(model, n_ctx):
    return Model(model.path, model.config, model.weights, model.tokenizer, model.chat_template, "numpy", np, n_ctx)


def test_decode_step_by_step_equals_one_prefill(model):
    ids = model.tokenize("The cache must give the same answer either way.")
    full = model.logits(ids)
    m = small_context(model, 64)
    prompt = 4
    rows = [forward(m.weights, m.config, m.ops, np.asarray(ids[:prompt]), 0, m.cache)]
    for pos in range(prompt, len(ids)):
        rows.append(forward(m.weights, m.config, m.ops, np.asarray(ids[pos:pos + 1]), pos, m.cache))
    np.testing.assert_allclose(np.concatenate(rows), full, atol=2e-4, rtol=0)


def test_cache_is_filled_in_place(model):
    m = small_context(model, 64)
    buffers = [id(k) for k in m.cache.k] + [id(v) for v in m.cache.v]
    list(m.generate(m.tokenize("Hello"), max_tokens=5, temperature=0))
    assert [id(k) for k in m.cache.k] + [id(v) for v in m.cache.v] == buffers
    assert m.cache.n_past == len(m.tokenize("Hello")) + 4  # the last token is sampled, not yet fed back
    assert np.any(m.cache.k[0][:, 1] != 0) and not np.any(m.cache.k[0][:, m.cache.n_past:])


def test_reset_gives_a_fresh_context(model):
    ids = model.tokenize("Same prompt twice")
    first = model.logits(ids)
    list(model.generate(model.tokenize("something else entirely"), max_tokens=3, temperature=0))
    np.testing.assert_array_equal(model.logits(ids), first)


def test_prompt_longer_than_context_is_a_clear_error(model):
    m = small_context(model, 8)
    with pytest.raises(refllama.RefllamaError, match="does not fit the context size 8"):
        m.logits(list(range(100, 109)))


def test_a_text_prompt_is_tokenized_and_anything_else_not_ids_is_refused(model):
    text = "The capital of France is"
    assert list(model.generate(text, max_tokens=4, temperature=0)) == list(
        model.generate(model.tokenize(text), max_tokens=4, temperature=0))
    for bad, fragment in ((["H", "i"], "prompt item 0 is 'H'"), ([1, 2.5], "prompt item 1 is '2.5'"),
                          ([True], "prompt item 0 is 'True'"), (7, "of type int")):
        with pytest.raises(refllama.RefllamaError, match=fragment):
            model.generate(bad)


def test_generation_stops_at_context_end(model):
    m = small_context(model, 10)
    gen = m.generate(m.tokenize("One two three four five"), max_tokens=50, temperature=0)
    out = list(gen)
    assert gen.finish_reason == "length" and len(m.tokenize("One two three four five")) + len(out) == 11


def test_generation_stops_at_max_tokens(model):
    gen = model.generate(model.tokenize("Count: 1, 2, 3,"), max_tokens=7, temperature=0)
    assert len(list(gen)) == 7 and gen.finish_reason == "length"


def test_chat_stops_at_end_of_turn_token(model):
    gen = model.chat([{"role": "user", "content": "What is the capital of France? Answer in one word."}],
                     max_tokens=64, temperature=0)
    out = list(gen)
    assert gen.finish_reason == "stop" and 2 not in out  # <|im_end|> ends the turn and is not yielded
    assert "Paris" in model.detokenize(out)


def test_chat_template_renders_system_and_user(model):
    text = model.render_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    ids = model.chat_tokens([{"role": "user", "content": "Hi"}])
    assert ids[0] == 1 and ids.count(1) == 3  # <|im_start|> parsed as one token, for system, user and assistant


def test_bad_chat_messages_are_named(model):
    with pytest.raises(refllama.RefllamaError, match="chat message 0"):
        model.render_chat([{"role": "user"}])


def test_stop_string_ends_generation_and_is_cut_from_text(model):
    ids = model.tokenize("The history of the printing press begins")
    greedy = model.detokenize(list(model.generate(ids, max_tokens=20, temperature=0)))
    assert "Gutenberg" in greedy  # the greedy continuation, as transformers' golden path has it
    gen = model.generate(ids, max_tokens=20, temperature=0, stop=["Gutenberg"])
    text = "".join(stream_text(model, gen, ["Gutenberg"]))
    assert gen.finish_reason == "stop" and text == greedy[:greedy.index("Gutenberg")]


def test_empty_prompt_and_bad_max_tokens_are_refused(model):
    with pytest.raises(refllama.RefllamaError, match="empty prompt"):
        model.logits([])
    with pytest.raises(refllama.RefllamaError, match="max_tokens"):
        model.generate([1], max_tokens=0)


def test_a_trace_is_a_mapping_of_stage_names_to_arrays(model):
    with refllama.trace(model) as t:
        model.logits(model.tokenize("Hi"))
    d = dict(t)
    assert list(d) == list(t.keys()) and len(d) == len(t) == 3 + 17 * model.config.n_layer
    assert list(t)[:2] == ["inp_embd", "attn_norm-0"] and "result_output" in t and "ffn_act-0" not in t
    assert t.get("ffn_act-0") is None and t.get("l_out-0") is t["l_out-0"]
    assert all(a is t[k] for k, a in t.items())


@pytest.mark.slow
def test_a_cancellable_generation_prefills_in_chunks_to_the_same_tokens_and_stops_when_cancelled(model):
    import threading

    from refllama.api import PREFILL_CHUNK

    ids = model.tokenize("The history of the printing press " * 50)
    assert len(ids) > 2 * PREFILL_CHUNK
    cancel = threading.Event()
    plain = list(model.generate(ids, max_tokens=6, temperature=0))
    gen = model.generate(ids, max_tokens=6, temperature=0, cancel=cancel)
    assert list(gen) == plain and gen.finish_reason == "length"
    gen = model.generate(ids, max_tokens=50, temperature=0, cancel=cancel)
    first = next(gen)
    cancel.set()
    assert first == plain[0] and list(gen) == [] and gen.finish_reason == "cancelled"
    cancelled = model.generate(ids, max_tokens=5, temperature=0, cancel=cancel)  # set before the prefill: no work
    assert list(cancelled) == [] and cancelled.finish_reason == "cancelled"
