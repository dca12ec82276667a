"""Samplers: each one's distribution, llama.cpp's penalty rule, and seeded reproducibility."""

import numpy as np
import pytest

import refllama
from refllama.sampling import Sampler, SamplingParams, min_p, penalize, top_k, top_p

LOGITS = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
N = 20000


def frequencies(params, logits=LOGITS, history=()):
    s = Sampler(params)
    draws = [s(logits, list(history)) for _ in range(N)]
    return np.bincount(draws, minlength=len(logits)) / N


def near(freq, probs):
    # 4 standard errors of a frequency estimated from N draws
    tol = 4 * np.sqrt(np.maximum(np.asarray(probs) * (1 - np.asarray(probs)), 1e-12) / N) + 1e-9
    return np.all(np.abs(freq - probs) <= tol)


def plain(**kw):
    return SamplingParams(**{"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 7, **kw})


def test_temperature_one_draws_the_softmax():
    assert near(frequencies(plain()), [0.5, 0.3, 0.15, 0.05])


def test_temperature_sharpens_and_flattens():
    for t in (0.5, 2.0):
        p = np.exp(LOGITS / t) / np.exp(LOGITS / t).sum()
        assert near(frequencies(plain(temperature=t)), p)


def test_temperature_zero_is_greedy():
    assert frequencies(plain(temperature=0.0))[0] == 1.0


def test_top_k_keeps_k_best_renormalised():
    assert near(frequencies(plain(top_k=2)), [0.5 / 0.8, 0.3 / 0.8, 0, 0])
    ids, kept = top_k(np.arange(4), LOGITS, 3)
    assert sorted(ids.tolist()) == [0, 1, 2]


def test_top_p_keeps_smallest_set_reaching_p():
    assert near(frequencies(plain(top_p=0.7)), [0.5 / 0.8, 0.3 / 0.8, 0, 0])  # 0.5 < 0.7 <= 0.8
    assert top_p(np.arange(4), LOGITS, 0.4)[0].tolist() == [0]  # the best token alone already reaches 0.4
    assert top_p(np.arange(4), LOGITS, 0.9)[0].tolist() == [0, 1, 2]


def test_min_p_keeps_tokens_above_fraction_of_best():
    assert near(frequencies(plain(min_p=0.25)), [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0])  # threshold 0.125
    assert min_p(np.arange(4), LOGITS, 0.7)[0].tolist() == [0]


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits():
    logits = np.array([2.0, -2.0, 1.0, 0.5])
    np.testing.assert_allclose(penalize(logits, [0, 1, 0], 2.0, 64), [1.0, -4.0, 1.0, 0.5])
    np.testing.assert_allclose(penalize(logits, [1, 0], 2.0, 1), [1.0, -2.0, 1.0, 0.5])  # window: last token only
    np.testing.assert_allclose(penalize(logits, [0, 1], 2.0, 0), logits)  # last_n = 0 disables


def test_frequency_and_presence_penalties_count_occurrences():
    out = penalize(np.zeros(3), [2, 2, 2, 1], 1.0, 64, frequency_penalty=0.5, presence_penalty=0.25)
    np.testing.assert_allclose(out, [0.0, -0.75, -1.75])


def test_repeat_penalty_changes_the_distribution():
    freq = frequencies(plain(repeat_penalty=4.0), logits=np.array([1.0, 1.0]), history=[0])
    assert near(freq, np.exp([0.25, 1.0]) / np.exp([0.25, 1.0]).sum())


def test_same_seed_same_draws_different_seed_different_draws():
    s1, s2, s3 = Sampler(plain(seed=3)), Sampler(plain(seed=3)), Sampler(plain(seed=4))
    d1 = [s1(LOGITS, []) for _ in range(200)]
    assert d1 == [s2(LOGITS, []) for _ in range(200)]
    assert d1 != [s3(LOGITS, []) for _ in range(200)]


@pytest.mark.slow  # several generations
def test_generation_is_reproducible_with_a_seed(model):
    ids = model.tokenize("Once upon a time")
    run = lambda seed: list(model.generate(ids, max_tokens=12, temperature=1.0, seed=seed))  # noqa: E731
    assert run(11) == run(11)
    assert run(11) != run(12) or run(11) != run(13)


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(top_p=0.0), dict(min_p=1.5), dict(repeat_penalty=0.0)])
def test_invalid_parameters_are_named(bad):
    with pytest.raises(refllama.RefllamaError, match=list(bad)[0]):
        SamplingParams(**bad)
