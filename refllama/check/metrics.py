"""How far two arrays of a stage are apart, over the entries compared (a query's visible keys in attention)."""

import numpy as np

from ..errors import RefllamaError
from .dump import ATTENTION, ROUTED_STAGES, split_name  # ATTENTION: [H, T, S], only the keys a query sees compared


def within(m, tol):
    return tol is None or (m["max_rel"] <= tol[0] and m["nmse"] <= tol[1])


CHUNK = 1 << 22  # entries per pass (32 MB of float64): a long prompt's logits are measured in slices


def metrics(a, b, valid=None):
    """Errors of a against the reference b (same shape), over the entries `valid` marks (default: all); summed a
    slice of CHUNK entries at a time along the first axis, in float64."""
    rows = max(1, CHUNK // max(1, a[0].size if a.ndim else 1))
    if a.ndim == 0 or len(a) <= rows:
        return _metrics(*_sums(a, b, valid))
    parts = [_sums(a[i:i + rows], b[i:i + rows], None if valid is None else valid[i:i + rows])
             for i in range(0, len(a), rows)]
    return _metrics(*(f(p[k] for p in parts) for k, f in enumerate((sum, max, min, max, sum, sum, sum, sum, sum))))


def _sums(a, b, valid):  # -> n, max |a - b|, min b, max b, sum (a - b)^2, sum b^2, sum a^2, sum a b, max |b|
    if valid is not None:
        a, b = a[valid], b[valid]
    a, b = a.astype(np.float64), b.astype(np.float64)
    if not np.isfinite(b).all():  # the same infinity in both (an expert group masked out) agrees: left out
        kept = ~(np.isinf(b) & (a == b))
        a, b = a[kept], b[kept]
    if a.size == 0:
        return 0, 0.0, np.inf, -np.inf, 0.0, 0.0, 0.0, 0.0, 0.0
    diff = a - b
    return (a.size, float(np.abs(diff).max()), float(b.min()), float(b.max()), float(np.sum(diff ** 2)),
            float(np.sum(b ** 2)), float(np.sum(a ** 2)), float(np.sum(a * b)), float(np.abs(b).max()))


def _metrics(n, max_abs, b_min, b_max, sq, norm_b, norm_a, dot, b_abs):
    if n == 0:
        return {"max_abs": 0.0, "max_rel": 0.0, "nmse": 0.0, "cosine": 1.0}
    span = (b_max - b_min) or b_abs or 1.0  # the reference's range (its largest value if constant, else 1)
    denom = float(np.sqrt(norm_a) * np.sqrt(norm_b))
    return {"max_abs": max_abs, "max_rel": max_abs / span, "nmse": sq / norm_b if norm_b else sq,
            "cosine": dot / denom if denom else 1.0}


def visible(stage, positions, shape):
    """For kq and kq_soft_max [H, P, S]: the keys each query position sees (k <= p); None for other stages."""
    if stage not in ATTENTION:
        return None
    return np.broadcast_to((np.arange(shape[-1])[None, :] <= np.asarray(positions)[:, None])[None], shape)


SLOT_STAGES = ("ffn_moe_topk", "ffn_moe_weights", "ffn_moe_weights_norm", "ffn_moe_weights_softmax",  # [T, K, ...]:
               "ffn_moe_weights_scaled", *ROUTED_STAGES)  # per slot


def take(dump_or_trace, name, positions, slots=None):
    """Rows of `name` at `positions` (each one it holds), along the stage's token axis; kq and kq_soft_max
    cut to the keys the last of them sees; a token's K experts' stages in the order of their ids, from the
    ffn_moe_topk of `slots` (default: the same dump; a re-run's: the dump whose ids it was given), so that engines
    which order the K slots differently compare expert by expert."""
    a = _rows(dump_or_trace, name, positions)
    stage, layer = split_name(name)
    ids = f"ffn_moe_topk-{layer}"
    slots = dump_or_trace if slots is None or stage == "ffn_moe_topk" else slots  # the ids: in their own order
    if stage in SLOT_STAGES and ids in slots and set(positions) <= set(slots.positions(ids)):
        order = np.argsort(_rows(slots, ids, positions), axis=1, kind="stable")  # [T, K]
        if order.shape == a.shape[:2]:
            a = np.take_along_axis(a, order.reshape(*order.shape, *[1] * (a.ndim - 2)), axis=1)
    return a


def _rows(dump_or_trace, name, positions):
    stored = dump_or_trace.positions(name)
    if list(stored) == list(positions):  # all of them, in order: the array itself, not a copy
        a = dump_or_trace[name]
    else:
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
