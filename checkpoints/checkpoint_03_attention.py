"""Stage 3: attention: unscaled scores (`kq-N`), softmax weights (`kq_soft_max-N`), weighted values
(`kqv_out-N`), output projection (`attn_out-N`)."""

import numpy as np

from refllama.layers import attention_mix, attention_scores, attention_weights, causal_mask, linear


def kv(case, which, layer):  # [S, KVH, HD] as stored -> [KVH, S, HD] as the cache holds it
    return case.ref[f"{which}-{layer}"].transpose(1, 0, 2)


def test_scores(case, layer, mode):
    name = f"kq-{layer}"
    if mode == "isolated":  # q rows at the stored positions, every key
        got = attention_scores(case.ref[f"Qcur_rope-{layer}"], kv(case, "Kcur_rope", layer))
        case.check(name, mode, got, positions=case.rows(f"Qcur_rope-{layer}"))
    else:
        case.check(name, mode, case.ours(name))


def test_softmax(case, layer, mode):
    name = f"kq_soft_max-{layer}"
    if mode == "isolated":
        S = case.ref[f"kq-{layer}"].shape[-1]
        mask = causal_mask(0, S, S, np)[case.rows(f"kq-{layer}")]  # [P, S]
        got = attention_weights(case.ref[f"kq-{layer}"], mask, case.cfg.head_dim)
        case.check(name, mode, got, positions=case.rows(f"kq-{layer}"))
    else:
        case.check(name, mode, case.ours(name))


def test_weighted_values(case, layer, mode):
    name = f"kqv_out-{layer}"
    if mode == "isolated":
        got = attention_mix(case.ref[f"kq_soft_max-{layer}"], kv(case, "Vcur", layer))
        case.check(name, mode, got, positions=case.rows(f"kq_soft_max-{layer}"))
    else:
        case.check(name, mode, case.ours(name))


def test_output_projection(case, layer, mode):
    name = f"attn_out-{layer}"
    if mode == "isolated":
        got = linear(case.ref[f"kqv_out-{layer}"], case.w["layers"][layer]["attn_output"])
        case.check(name, mode, got, positions=case.rows(f"kqv_out-{layer}"))
    else:
        case.check(name, mode, case.ours(name))
