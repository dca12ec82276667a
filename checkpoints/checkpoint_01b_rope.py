"""Stage 1b: rotary position embedding of q and k (`Qcur_rope-N`, `Kcur_rope-N`), GGUF's interleaved pairs."""

import numpy as np
import pytest

from refllama.layers import ROPE


@pytest.mark.parametrize("which", ["Qcur", "Kcur"])
def test_rope(case, layer, mode, which):
    name = f"{which}_rope-{layer}"
    if mode == "isolated":
        pos = np.asarray(case.rows(name))
        rope = ROPE[case.cfg.rope_layout]
        got = rope(case.ref[f"{which}-{layer}"], case.model.cache.cos[pos], case.model.cache.sin[pos])
    else:
        got = case.ours(name)
    case.check(name, mode, got)
