"""Stage 0: token embeddings (`inp_embd`), a row lookup in `token_embd`."""

import numpy as np

from refllama.layers import embedding


def test_embedding(case, mode):
    pos = case.rows("inp_embd")
    tokens = np.asarray(case.ids)[pos]
    got = embedding(tokens, case.w["token_embd"]) if mode == "isolated" else case.ours("inp_embd")
    case.check("inp_embd", mode, got)
