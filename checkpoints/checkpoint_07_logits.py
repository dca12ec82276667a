"""Stage 7: logits (`result_output`): values within tolerance and the same best token."""

import numpy as np

from refllama.layers import linear
from refllama.xp import to_numpy

NEAR_TIE = 0.25  # llama.cpp's best token may differ from ours only if ours rates it within this many logits


def our_logits(case, mode):  # -> [P, V] NumPy, whatever the backend computes on
    if mode == "end_to_end":
        return case.ours("result_output")
    pos = case.rows("result_output")
    norm_pos = case.rows("result_norm")
    h = case.ref["result_norm"][[norm_pos.index(p) for p in pos]]  # [P, D] at the logit positions
    return to_numpy(linear(h, case.w["output"]))


def test_logits(case, mode):
    case.check("result_output", mode, our_logits(case, mode))


def test_top1(case, mode):
    got, want = our_logits(case, mode), case.dump["result_output"]
    ref_best = want.argmax(axis=1)
    gap = got.max(axis=1) - got[np.arange(len(got)), ref_best]  # 0 where the best tokens agree
    if case.exact:
        assert (gap == 0).all(), f"{case}: best token differs at positions {np.flatnonzero(gap)}"
    else:
        assert (gap <= NEAR_TIE).all(), f"{case}: llama.cpp's best token is {gap.max():.3f} logits below ours"


def test_top5_agreement(case, mode):
    """The reference's 5 best tokens are ours too: all 5 for a float32 reference, at least 4 for llama.cpp on
    quantized weights."""
    got, want = our_logits(case, mode), case.dump["result_output"]
    need = 5 if case.exact else 4
    for row, (g, w) in enumerate(zip(got, want, strict=True)):
        shared = len(set(np.argsort(-g)[:5]) & set(np.argsort(-w)[:5]))
        assert shared >= need, f"{case}: logit row {case.rows('result_output')[row]} shares {shared} of the top 5"
