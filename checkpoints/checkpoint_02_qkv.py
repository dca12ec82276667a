"""Stage 2: q, k and v projections of the normed block input (`Qcur-N`, `Kcur-N`, `Vcur-N`), before RoPE."""

import pytest

from refllama.layers import linear

WEIGHT = {"Qcur": "attn_q", "Kcur": "attn_k", "Vcur": "attn_v"}


@pytest.mark.parametrize("which", list(WEIGHT))
def test_projection(case, layer, mode, which):
    def isolated():  # at the positions of the input (K/V store every position, the norm may not)
        h = case.ref[f"attn_norm-{layer}"]  # [P, D]
        return linear(h, case.w["layers"][layer][WEIGHT[which]]).reshape(len(h), -1, case.cfg.head_dim)
    case.stage(f"{which}-{layer}", mode, isolated, fed_by=f"attn_norm-{layer}")
