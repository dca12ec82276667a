"""A whole text's logits: how much the departure of one engine's logits from a reference's matters."""

import numpy as np

from ..errors import RefllamaError
from .dump import Dump
from .metrics import take


def logits_verdict(mine_path, ref_path, numerics=None):
    """Per-token KL divergence of MINE's next-token distribution from REF's, top-1 agreement, both perplexities,
    and the verdict of the band they fall in (band). MINE: a dump with result_output, or an .npy of [T, V] (rows:
    positions 0..T-1); `numerics`: what MINE computes in (default: its manifest's, float32 for an .npy)."""
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
        mine_pos, mine_numerics = list(range(len(a))), numerics or "float32"
    else:
        mine = Dump(mine_path)
        if "result_output" not in mine:
            raise RefllamaError(f"{mine_path}: holds no result_output (logits)")
        if mine.token_ids[:len(ref.token_ids)] != ref.token_ids[:len(mine.token_ids)]:
            raise RefllamaError("the dumps are of different token ids")
        a, mine_pos = mine["result_output"].astype(np.float64), mine.positions("result_output")
        mine_numerics = numerics or mine.numerics
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

    v = {"positions": len(positions), "kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)),
         "kl_max": float(kl.max()), "top1": float(np.mean(a.argmax(-1) == b.argmax(-1))),
         "ppl_mine": float(np.exp(nll(la))), "ppl_ref": float(np.exp(nll(lb))), "scored": len(scored),
         "numerics": [mine_numerics, ref.numerics]}
    return {**v, **band(v["kl_mean"], mine_numerics, ref.numerics)}


def _log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


# Bands of the mean KL(REF || MINE), measured (2026-11-25) on SmolLM2-135M Q4_1 (4 prompts) and Gemma 3 270M Q4_K_M
# (3), the checkpoint suite's references: two engines in one arithmetic (refllama float32 against transformers
# float32; refllama ggml against llama.cpp, whose Gemma 3 logits are stored as float16) part by at most 6.8e-6;
# float32 against llama.cpp's quantized arithmetic on the same file by 1.7e-3 to 1.1e-2. Bugs measured against
# llama.cpp from a float32 engine: a RoPE theta 10x 6.2e-3 to 0.62, a softmax scale 1.25x 4.5e-2 to 9.1e-2, Gemma 3's
# local and global bases swapped 5.4e-2 to 0.16, RMSNorm eps 1e-3 2.8e-3 to 0.33: the small ones inside the
# quantized band, found only against a reference in MINE's own arithmetic.
# refllama float32 against transformers float32 (8 positions of SmolLM2's 4 references, 3 of Gemma 3's 4): at most
# 2.1e-11 (2026-11-27), where an RMSNorm eps of 1e-6 for 1e-5 gives 3.9e-7: two float32 engines get a band of their own.
FLOAT32_KL = 1e-8  # float32 on both sides
ROUNDING_KL = 1e-4  # llama.cpp's arithmetic (ggml) on both sides: its logits may be stored as float16
QUANTIZED_KL = 2e-2  # one side in float32, the other in a coarser arithmetic (ggml's 8-bit activations, bf16, f16)


def band(kl_mean, mine_numerics, ref_numerics):
    """The verdict of a mean KL: "rounding", "quantized-like" (only where the two sides compute in different
    arithmetic) or "a bug", with the limit that applied."""
    same = mine_numerics == ref_numerics and mine_numerics in ("float32", "ggml")
    rounding = FLOAT32_KL if mine_numerics == ref_numerics == "float32" else ROUNDING_KL
    if kl_mean <= rounding:
        return {"verdict": "rounding", "limit": rounding}
    if not same and kl_mean <= QUANTIZED_KL:
        return {"verdict": "quantized-like", "limit": QUANTIZED_KL}
    return {"verdict": "a bug", "limit": rounding if same else QUANTIZED_KL}


WHY = {
    "rounding": "the same distribution, up to float rounding",
    "quantized-like": "a departure like a quantized model's from float32: a bug this small cannot be told from it "
                      "here; compare against a reference in MINE's own arithmetic (refllama --numerics ggml for a "
                      "ggml port, float32 for a float32 engine) to tell",
    "a bug": "past every departure measured between correct engines: look for the first divergence with a stage dump",
}


def print_logits(v):
    print(f"verdict: {v['verdict']}: {WHY[v['verdict']]} (mean KL {v['kl_mean']:.3e}, limit {v['limit']:.0e} for "
          f"MINE in {v['numerics'][0]} against REF in {v['numerics'][1]})")
    print(f"positions: {v['positions']} (perplexity over the {v['scored']} with a next token)")
    print(f"KL(REF || MINE): mean {v['kl_mean']:.3e}, p99 {v['kl_p99']:.3e}, max {v['kl_max']:.3e}")
    print(f"top-1 agreement: {v['top1']:.2%}")
    print(f"perplexity: MINE {v['ppl_mine']:.6g}, REF {v['ppl_ref']:.6g}")
    return exit_code(v)


def exit_code(v):
    return 1 if v["verdict"] == "a bug" else 0
