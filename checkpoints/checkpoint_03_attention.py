"""Stage 3: attention: unscaled scores (`kq-N`), softmax weights (`kq_soft_max-N`), weighted values
(`kqv_out-N`), output projection (`attn_out-N`)."""

from refllama.layers import causal_mask, linear
from refllama.numerics.ggml_tables import round_f16


def kv(case, which, layer):  # [S, KVH, HD] as stored -> [KVH, S, HD] as the cache holds it
    x = case.ref[f"{which}-{layer}"].transpose(1, 0, 2)
    return round_f16(x) if case.model.ops.kv_f16 else x  # numerics "ggml": a float16 cache


def test_scores(case, layer, mode):  # q rows at the stored positions, every key
    q = f"Qcur_rope-{layer}"
    k = kv(case, "Kcur_rope", layer)
    case.stage(f"kq-{layer}", mode, lambda: case.model.ops.attention_scores(case.ref[q], k), fed_by=q)


def test_softmax(case, layer, mode):
    def isolated():
        kq = case.ref[f"kq-{layer}"]  # [H, P, S]
        mask = causal_mask(0, kq.shape[-1], kq.shape[-1], case.model.xp)[case.rows(f"kq-{layer}")]  # [P, S]
        return case.model.ops.attention_weights(kq, mask, case.cfg.kq_scale)
    case.stage(f"kq_soft_max-{layer}", mode, isolated, fed_by=f"kq-{layer}")


def test_weighted_values(case, layer, mode):
    p = f"kq_soft_max-{layer}"
    v = kv(case, "Vcur", layer)
    case.stage(f"kqv_out-{layer}", mode, lambda: case.model.ops.attention_mix(case.ref[p], v), fed_by=p)


def test_output_projection(case, layer, mode):
    x, w = f"kqv_out-{layer}", case.w["layers"][layer]["attn_output"]
    case.stage(f"attn_out-{layer}", mode, lambda: linear(case.ref[x], w, case.bias(layer, "attn_output")), fed_by=x)
