"""RoPE pair layouts: which q/k dims rotate together, and the permutation between llama.cpp's two orders."""

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
