"""Stage 8: greedy tokens. transformers, and llama.cpp on F32 weights with an F32 cache (float32, like refllama): the
same tokens; llama.cpp on quantized weights against refllama in numerics "ggml": the same 64 tokens. llama.cpp on
quantized weights against refllama in float32: along llama.cpp's greedy path, refllama's best token agrees or is a
near-tie."""

import numpy as np

NEAR_TIE = 0.25
FAST_MODELS = ("gguf-numpy", "hf-numpy", "f32-numpy")  # numerics ggml's 64 greedy tokens: 16 s of NumPy emulation


def test_greedy(case):
    path = case.ref.manifest["greedy"]
    assert path, f"{case}: the reference recorded no greedy tokens"
    if case.exact:  # up to the first end-of-generation token, where refllama stops (the recorder did not)
        eog = [i for i, t in enumerate(path) if t in case.model.tokenizer.eog_ids]
        want = path[:eog[0]] if eog else path  # the end token itself is not yielded
        assert list(case.model.generate(case.ids, max_tokens=len(path), temperature=0)) == want
        return
    logits = case.model.logits(case.ids + path[:-1])[len(case.ids) - 1:]  # teacher forcing along llama.cpp's path
    gap = logits.max(axis=1) - logits[np.arange(len(path)), path]
    assert (gap <= NEAR_TIE).all(), f"{case}: step {gap.argmax()} picks a token {gap.max():.3f} logits below ours"
    assert (gap == 0).mean() >= 0.75, f"{case}: top-1 agrees on only {(gap == 0).mean():.0%} of steps"
