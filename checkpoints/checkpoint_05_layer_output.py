"""Stage 5: the block output, feed-forward residual (`l_out-N`)."""


def test_layer_output(case, layer, mode):
    name = f"l_out-{layer}"
    got = case.ref[f"ffn_inp-{layer}"] + case.ref[f"ffn_out-{layer}"] if mode == "isolated" else case.ours(name)
    case.check(name, mode, got)
