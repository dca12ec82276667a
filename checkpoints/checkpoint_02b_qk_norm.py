"""Stage 2b (Qwen3): the per-head RMS norm of q and k before RoPE (`Qcur_normed-N`, `Kcur_normed-N`), each head's
HD dims normed with one shared weight."""

import pytest

NEEDS = "Qcur_normed"  # only the models whose blocks have it


@pytest.mark.parametrize("which", ["Qcur", "Kcur"])
def test_qk_norm(case, layer, mode, which):
    weight = case.w["layers"][layer]["attn_q_norm" if which == "Qcur" else "attn_k_norm"]
    x = f"{which}-{layer}"
    norm = case.model.ops.rms_norm
    case.stage(f"{which}_normed-{layer}", mode, lambda: norm(case.ref[x], weight, case.cfg.rms_eps), fed_by=x)
