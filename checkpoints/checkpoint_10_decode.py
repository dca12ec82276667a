"""Stage 10: decode steps. SmolLM2's references hold 4 greedy decode steps after the prefill, one token each, by
llama.cpp and by transformers through their KV caches. refllama decodes the same tokens one at a time through
its own cache, and every stage of every step must agree, matched by token position as refllama.compare matches
them, within the reference's column of the table."""

import harness

from refllama.check.compare import compare

DECODE = True  # only the references that hold decode steps


def test_decode_steps(case, tmp_path):
    d = case.dump
    ours = case.model.dump(d.prompt_ids, tmp_path / "ours", decode_ids=d.decode_ids,
                           layers=harness.stored_layers(harness.Ref("", case.source, case.prompt, d.dir)))
    rep = compare(ours, d.dir, column=case.kind)
    decode = [r for r in rep.rows if any(p >= len(d.prompt_ids) for p in r["positions"])]
    assert len(decode) == len(rep.rows), "a stage was compared at the prompt's positions only"
    assert rep.first is None, f"{case!r}: {rep.first['name']} at {rep.first['positions']}: {rep.where + rep.hints}"
