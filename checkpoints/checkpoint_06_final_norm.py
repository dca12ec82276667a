"""Stage 6: the final RMS norm (`result_norm`) of the last block's output."""

from refllama.layers import rms_norm


def test_final_norm(case, mode):
    last = f"l_out-{case.cfg.n_layer - 1}"
    got = rms_norm(case.ref[last], case.w["output_norm"], case.cfg.rms_eps) if mode == "isolated" else case.ours("result_norm")
    case.check("result_norm", mode, got, positions=case.rows(last) if mode == "isolated" else None)
