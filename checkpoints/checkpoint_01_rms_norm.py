"""Stage 1: RMS norm before attention (`attn_norm-N`) and before the feed-forward block (`ffn_norm-N`)."""

from harness import block_input


def test_attn_norm(case, layer, mode):
    name = f"attn_norm-{layer}"
    x = case.ref[block_input(layer)]  # [T, D], the block input at the same positions
    got = case.model.ops.rms_norm(x, case.w["layers"][layer]["attn_norm"], case.cfg.rms_eps) if mode == "isolated" \
        else case.ours(name)
    case.check(name, mode, got)


def test_ffn_norm(case, layer, mode):
    name = f"ffn_norm-{layer}"
    x = case.ref[f"ffn_inp-{layer}"]
    got = case.model.ops.rms_norm(x, case.w["layers"][layer]["ffn_norm"], case.cfg.rms_eps) if mode == "isolated" \
        else case.ours(name)
    case.check(name, mode, got)
