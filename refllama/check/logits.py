"""A whole text's logits: how much the departure of one engine's logits from a reference's matters."""

import numpy as np

from ..errors import RefllamaError
from .dump import Dump
from .metrics import take


def logits_verdict(mine_path, ref_path):
    """Per-token KL divergence of MINE's next-token distribution from REF's, top-1 agreement, both perplexities.
    MINE: a dump with result_output, or an .npy of [T, V] (rows: positions 0..T-1)."""
    ref = Dump(ref_path)
    if "result_output" not in ref:
        raise RefllamaError(f"{ref_path}: holds no result_output (logits)")
    if str(mine_path).endswith(".npy"):
        try:
            a = np.load(mine_path, allow_pickle=False).astype(np.float64)
        except (OSError, ValueError) as e:
            raise RefllamaError(f"{mine_path}: cannot read ({e})") from None
        a = a[0] if a.ndim == 3 and a.shape[0] == 1 else a
        if a.ndim != 2:
            raise RefllamaError(f"{mine_path}: logits must be [T, V], got {list(a.shape)}")
        mine_pos = list(range(len(a)))
    else:
        mine = Dump(mine_path)
        if "result_output" not in mine:
            raise RefllamaError(f"{mine_path}: holds no result_output (logits)")
        if mine.token_ids[:len(ref.token_ids)] != ref.token_ids[:len(mine.token_ids)]:
            raise RefllamaError("the dumps are of different token ids")
        a, mine_pos = mine["result_output"].astype(np.float64), mine.positions("result_output")
    positions = sorted(set(mine_pos) & set(ref.positions("result_output")))
    if not positions:
        raise RefllamaError("the logits share no token positions")
    b = take(ref, "result_output", positions).astype(np.float64)
    a = a[[mine_pos.index(p) for p in positions]]
    if a.shape != b.shape:
        raise RefllamaError(f"logits shapes differ: {list(a.shape)} vs {list(b.shape)}")
    la, lb = _log_softmax(a), _log_softmax(b)
    kl = np.sum(np.exp(lb) * (lb - la), axis=-1)  # KL(REF || MINE), per position
    ids = ref.token_ids
    scored = [i for i, p in enumerate(positions) if p + 1 < len(ids)]

    def nll(lp):
        return float(np.mean([-lp[i, ids[positions[i] + 1]] for i in scored])) if scored else float("nan")

    return {"positions": len(positions), "kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)),
            "kl_max": float(kl.max()), "top1": float(np.mean(a.argmax(-1) == b.argmax(-1))),
            "ppl_mine": float(np.exp(nll(la))), "ppl_ref": float(np.exp(nll(lb))), "scored": len(scored)}


def _log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


KL_SAME, KL_CLOSE, TOP1_CLOSE = 1e-4, 5e-2, 0.9  # numerics only; a quantized model's usual departure


def print_logits(v):
    print(f"positions: {v['positions']} (perplexity over the {v['scored']} with a next token)")
    print(f"KL(REF || MINE): mean {v['kl_mean']:.3e}, p99 {v['kl_p99']:.3e}, max {v['kl_max']:.3e}")
    print(f"top-1 agreement: {v['top1']:.2%}")
    print(f"perplexity: MINE {v['ppl_mine']:.4f}, REF {v['ppl_ref']:.4f}")
    print(f"verdict: {verdict(v)}")
    return 0 if close_enough(v) else 1


def close_enough(v):
    return v["kl_mean"] <= KL_CLOSE and v["top1"] >= TOP1_CLOSE


def verdict(v):
    if v["kl_mean"] <= KL_SAME and v["top1"] == 1:
        return "the same distribution (float rounding)"
    if close_enough(v):
        return "close: a departure like a quantized model's"
    return "different: look for the first divergence with a stage dump"
