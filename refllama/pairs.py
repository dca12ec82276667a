"""RoPE pair layouts: which q/k dims rotate together, and the permutation between llama.cpp's two orders; linear
attention's v head orders (HF's grouped, llama.cpp's tiled) and the reordering between them."""

import numpy as np

LAYOUTS = ("interleaved", "half")  # llama.cpp's rope modes NORM (pairs 2i, 2i+1) and NEOX (pairs i, i + R/2)
QK_STAGES = ("Qcur", "Kcur", "Qcur_normed", "Kcur_normed", "Qcur_rope", "Kcur_rope")  # last axis: a head's dims


def pair_order(head_dim, rope_dim, to):  # -> [HD] indices: out[..., j] = x[..., order[j]]
    """The reordering of a head's dims that takes q/k from one RoPE pair layout to the other ("half" or
    "interleaved"); only the first rope_dim dims rotate, the rest stay where they are."""
    to_half = np.concatenate([np.arange(0, rope_dim, 2), np.arange(1, rope_dim, 2), np.arange(rope_dim, head_dim)])
    return to_half if to == "half" else np.argsort(to_half)


def permute_qk(a, to, rope_dim=None, axis=-1):
    """q/k from one pair layout to the other: "half" (HF, llama.cpp's NEOX) <-> "interleaved" (llama.cpp's NORM).

    `axis` holds a head's HD dims (the last axis of a [T, H, HD] stage, axis 1 of weight rows [H, HD, D]);
    rope_dim (default HD) are the leading dims that rotate (partial rotary). The helper for anyone whose engine
    keeps the other layout; refllama's loaders and dump reader use it too."""
    hd = a.shape[axis]
    return np.take(a, pair_order(hd, hd if rope_dim is None else rope_dim, to), axis=axis)


def permute_rows(w, n_heads, rope_dim, to):  # [n*HD, ...] -> same, each head's rows reordered
    return permute_qk(w.reshape(n_heads, -1, *w.shape[1:]), to, rope_dim, axis=1).reshape(w.shape)


V_HEAD_ORDERS = ("tiled", "grouped")  # v head h reads q/k head h % LK (llama.cpp's), or h // (LV / LK) (HF's)
# linear attention's stages with v heads, by the form of their last axis: LV heads ("heads" of [T, LV, LD], "units"
# of [T, LV]), LV heads of LD flattened ("flat"), or q, k, v's channels side by side ("qkv")
V_HEAD_STAGES = {**dict.fromkeys(("v_conv", "attn_output"), "heads"),
                 **dict.fromkeys(("beta", "beta_sigmoid", "alpha", "a_softplus", "gate"), "units"),
                 **dict.fromkeys(("z", "final_output"), "flat"),
                 **dict.fromkeys(("linear_attn_qkv_mixed", "conv_output_raw", "conv_output_silu"), "qkv")}


def tiled_order(n, start, unit, n_k, n_v, to="tiled"):  # -> [n] indices: out[..., j] = x[..., order[j]]
    """The n_v heads of `unit` entries from `start` (of n) from grouped order (the n_v / n_k v heads of q/k head 0,
    then of head 1, ...) to tiled (v head h reads q/k head h % n_k: llama.cpp's), or back (`to` "grouped")."""
    heads = np.arange(n_v * unit).reshape(n_k, n_v // n_k, unit).transpose(1, 0, 2).reshape(-1)
    if to == "grouped":
        heads = np.argsort(heads)
    return np.concatenate([np.arange(start), heads + start, np.arange(start + n_v * unit, n)])


def reorder_v_heads(stage, a, n_k, n_v, to="tiled"):  # [T, ...] -> same, its v heads in order `to`
    """A linear-attention stage (V_HEAD_STAGES) of a model with n_k q/k heads, n_v v heads, from one v head order to
    the other."""
    form = V_HEAD_STAGES[stage]
    if form == "heads":
        return np.take(a, tiled_order(n_v, 0, 1, n_k, n_v, to), axis=1)
    width = {"units": 1, "flat": a.shape[-1] // n_v, "qkv": a.shape[-1] // (2 * n_k + n_v)}[form]
    start = 2 * n_k * width if form == "qkv" else 0
    return np.take(a, tiled_order(a.shape[-1], start, width, n_k, n_v, to), axis=-1)
