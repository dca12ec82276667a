"""Stage 1b: rotary position embedding of q and k (`Qcur_rope-N`, `Kcur_rope-N`), in the pair layout llama.cpp uses
for the architecture; its input is the projection, or Qwen3's per-head norm of it."""

import numpy as np
import pytest


@pytest.mark.parametrize("which", ["Qcur", "Kcur"])
def test_rope(case, layer, mode, which):
    name = f"{which}_rope-{layer}"
    if mode == "isolated":
        pos = np.asarray(case.rows(name))
        rope = case.model.ops.rope[case.cfg.rope_layout]
        source = f"{which}_normed" if case.has(f"{which}_normed") else which
        got = rope(case.ref[f"{source}-{layer}"], case.model.cache.cos[pos], case.model.cache.sin[pos])
    else:
        got = case.ours(name)
    case.check(name, mode, got)
