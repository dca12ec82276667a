"""Stage 2: q, k and v projections of the normed block input (`Qcur-N`, `Kcur-N`, `Vcur-N`), before RoPE;
Qwen2's biases included."""

import pytest

from refllama.layers import linear

WEIGHT = {"Qcur": "attn_q", "Kcur": "attn_k", "Vcur": "attn_v"}


@pytest.mark.parametrize("which", list(WEIGHT))
def test_projection(case, layer, mode, which):
    def isolated():  # at the positions of the input (K/V store every position, the norm may not)
        h = case.ref[f"attn_norm-{layer}"]  # [P, D]
        w = WEIGHT[which]
        return linear(h, case.w["layers"][layer][w], case.bias(layer, w)).reshape(len(h), -1, case.cfg.head_dim)
    case.stage(f"{which}-{layer}", mode, isolated, fed_by=f"attn_norm-{layer}")
