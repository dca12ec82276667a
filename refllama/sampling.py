"""Token samplers with llama.cpp's semantics and order: penalties -> top-k -> top-p -> min-p -> temperature -> draw.

Each step is a pure function on a candidate set (ids [N], logits [N]); the Sampler chains them with a
seeded generator, so the same seed gives the same tokens.
"""

import math
from dataclasses import dataclass

import numpy as np

from .errors import RefllamaError


def penalize(logits, history, repeat_penalty, last_n, frequency_penalty=0.0, presence_penalty=0.0):  # [V] -> [V]
    """llama.cpp's penalties over the last `last_n` tokens of history (prompt included).

    A token seen there has its logit divided by repeat_penalty if positive, multiplied if negative,
    then lowered by frequency_penalty * count + presence_penalty.
    """
    if last_n == 0 or (repeat_penalty == 1.0 and frequency_penalty == 0.0 and presence_penalty == 0.0):
        return logits
    window = history[-last_n:] if last_n > 0 else history
    if len(window) == 0:
        return logits
    seen, count = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    out = logits.copy()
    lv = out[seen]
    lv = np.where(lv > 0, lv / repeat_penalty, lv * repeat_penalty)
    out[seen] = lv - count * frequency_penalty - presence_penalty
    return out


def top_k(ids, logits, k):  # keep the k highest logits (k <= 0: all)
    if k <= 0 or k >= len(ids):
        return ids, logits
    keep = np.argpartition(-logits, k - 1)[:k]
    return ids[keep], logits[keep]


def softmax(logits):
    e = np.exp(logits - logits.max())
    return e / e.sum()


def top_p(ids, logits, p):  # smallest set of most likely tokens whose probability reaches p
    if p >= 1.0:
        return ids, logits
    order = np.argsort(-logits, kind="stable")
    cum = np.cumsum(softmax(logits[order]))
    n = int(np.searchsorted(cum, p)) + 1  # first index where the running sum reaches p, inclusive
    keep = order[:min(n, len(order))]
    return ids[keep], logits[keep]


def min_p(ids, logits, p):  # keep tokens whose probability is at least p times the best one's
    if p <= 0.0:
        return ids, logits
    keep = logits >= logits.max() + np.log(p)
    return ids[keep], logits[keep]


@dataclass(frozen=True)
class SamplingParams:
    """Defaults are llama.cpp's. temperature <= 0 means greedy (argmax)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None

    def __post_init__(self):
        checks = [
            ("temperature", self.temperature >= 0), ("top_p", 0.0 < self.top_p <= 1.0),
            ("min_p", 0.0 <= self.min_p <= 1.0), ("repeat_penalty", self.repeat_penalty > 0),
            ("repeat_last_n", self.repeat_last_n >= -1),
            ("seed", self.seed is None or (isinstance(self.seed, int) and 0 <= self.seed < 2 ** 64)),
            *((name, math.isfinite(getattr(self, name))) for name in (
                "temperature", "top_p", "min_p", "repeat_penalty", "frequency_penalty", "presence_penalty")),
        ]
        for name, ok in checks:
            if not ok:
                raise RefllamaError(f"invalid sampling parameter {name}={getattr(self, name)!r}")


class Sampler:
    """Chooses the next token from a row of logits and the token history."""

    def __init__(self, params):
        self.p = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits, history):  # [V] float, list[int] -> int
        p = self.p
        logits = penalize(np.asarray(logits, dtype=np.float64), history, p.repeat_penalty, p.repeat_last_n,
                          p.frequency_penalty, p.presence_penalty)
        if np.isnan(logits).any() or np.isposinf(logits).any() or np.isneginf(logits).all():
            raise RefllamaError("the model's logits are NaN or infinite: nothing to sample from (corrupt weights?)")
        if p.temperature <= 0:
            return int(np.argmax(logits))
        ids = np.arange(len(logits))
        ids, logits = top_k(ids, logits, p.top_k)
        ids, logits = top_p(ids, logits, p.top_p)
        ids, logits = min_p(ids, logits, p.min_p)
        with np.errstate(over="ignore"):  # a tiny temperature sends every logit below the best one to -inf
            probs = softmax((logits - logits.max()) / p.temperature)
        return int(ids[self.rng.choice(len(ids), p=probs)])
