"""Stage 4: the attention residual (`ffn_inp-N`) and the SwiGLU feed-forward block: gate, up, swiglu, down."""

import pytest
from harness import block_input

from refllama.layers import linear


def test_attention_residual(case, layer, mode):
    name = f"ffn_inp-{layer}"
    got = case.ref[block_input(layer)] + case.ref[f"attn_out-{layer}"] if mode == "isolated" else case.ours(name)
    case.check(name, mode, got)


@pytest.mark.parametrize("which, weight", [("ffn_gate", "ffn_gate"), ("ffn_up", "ffn_up")])
def test_gate_and_up(case, layer, mode, which, weight):
    name = f"{which}-{layer}"
    h = case.ref[f"ffn_norm-{layer}"]
    w, b = case.w["layers"][layer][weight], case.bias(layer, weight)
    got = linear(h, w, b) if mode == "isolated" else case.ours(name)
    case.check(name, mode, got)


def test_swiglu(case, layer, mode):
    name = f"ffn_swiglu-{layer}"
    gate, up = case.ref[f"ffn_gate-{layer}"], case.ref[f"ffn_up-{layer}"]
    got = case.model.ops.swiglu(gate, up) if mode == "isolated" else case.ours(name)
    case.check(name, mode, got)


def test_down(case, layer, mode):
    name = f"ffn_out-{layer}"
    h = case.ref[f"ffn_swiglu-{layer}"]
    got = linear(h, case.w["layers"][layer]["ffn_down"], case.bias(layer, "ffn_down")) if mode == "isolated" \
        else case.ours(name)
    case.check(name, mode, got)
