"""How far two arrays of a stage are apart, over the entries compared (a query's visible keys in attention)."""

import numpy as np

from ..errors import RefllamaError
from .dump import split_name

ATTENTION = ("kq", "kq_soft_max")  # [H, T, S]: only the keys a query sees are compared


def within(m, tol):
    return tol is None or (m["max_rel"] <= tol[0] and m["nmse"] <= tol[1])


def metrics(a, b, valid=None):
    """Errors of a against the reference b (same shape), over the entries `valid` marks (default: all)."""
    if valid is not None:
        a, b = a[valid], b[valid]
    a, b = a.astype(np.float64), b.astype(np.float64)
    if a.size == 0:
        return {"max_abs": 0.0, "max_rel": 0.0, "nmse": 0.0, "cosine": 1.0}
    diff = a - b
    span = value_range(b)
    norm_b = float(np.sum(b ** 2))
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    return {"max_abs": float(np.abs(diff).max()), "max_rel": float(np.abs(diff).max()) / span,
            "nmse": float(np.sum(diff ** 2)) / norm_b if norm_b else float(np.sum(diff ** 2)),
            "cosine": float(np.sum(a * b)) / denom if denom else 1.0}


def value_range(b):  # the reference's range, what max_rel divides by (its largest value if constant, else 1)
    return float(b.max() - b.min()) or float(np.abs(b).max()) or 1.0


def wrong_positions(a, b, stage, positions, tol):
    """The positions (along the stage's token axis) whose own entries are past the max_rel tolerance `tol`, measured
    against the range of the whole stage as `metrics` measures it."""
    valid = visible(stage, positions, b.shape)
    diff = np.abs(a.astype(np.float64) - b)
    if valid is not None:
        diff = np.where(valid, diff, 0.0)
    per = np.moveaxis(diff, 1 if stage in ATTENTION else 0, 0).reshape(len(positions), -1).max(axis=1)
    span = value_range(b[valid] if valid is not None else b)
    return [p for p, e in zip(positions, per) if e / span > tol[0]]


def visible(stage, positions, shape):
    """For kq and kq_soft_max [H, P, S]: the keys each query position sees (k <= p); None for other stages."""
    if stage not in ATTENTION:
        return None
    return np.broadcast_to((np.arange(shape[-1])[None, :] <= np.asarray(positions)[:, None])[None], shape)


def take(dump_or_trace, name, positions):
    """Rows of `name` at `positions` (each one it holds), along the stage's token axis; kq and kq_soft_max
    cut to the keys the last of them sees."""
    stored = dump_or_trace.positions(name)
    index = {p: i for i, p in enumerate(stored)}
    a = np.take(dump_or_trace[name], [index[p] for p in positions], axis=dump_or_trace.token_axis(name))
    if split_name(name)[0] in ATTENTION:
        a = a[..., :max(positions) + 1]
        if a.shape[-1] <= max(positions):
            raise RefllamaError(f"stage '{name}': {a.shape[-1]} keys stored, position {max(positions)} sees more")
    return a


def spans(numbers):  # [0, 1, 2, 5] -> "0-2, 5"
    spans, start = [], None
    for i, n in enumerate(numbers):
        start = n if start is None else start
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            spans.append(f"{start}-{n}" if n > start else f"{n}")
            start = None
    return ", ".join(spans) or "none"
