"""Stage 6: the final RMS norm (`result_norm`) of the last block's output."""

from refllama.layers import rms_norm


def test_final_norm(case, mode):
    last = f"l_out-{case.cfg.n_layer - 1}"
    case.stage("result_norm", mode, lambda: rms_norm(case.ref[last], case.w["output_norm"], case.cfg.rms_eps),
               fed_by=last)
