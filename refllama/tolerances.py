"""The checkpoint tolerances: per stage, (max_rel, nmse) for each reference kind, in REFERENCE_KINDS order.

max_rel = max |ours - reference| / (max - min of the reference); nmse = sum((ours - reference)^2) / sum(reference^2).
Why each number is what it is: checkpoints/README.md, whose table a test keeps equal to this one.
"""

REFERENCE_KINDS = ("llama.cpp", "transformers", "llama.cpp F32")  # the last: F32 weights and KV cache
_ROWS = {  # stage: ((llama.cpp), (transformers), (llama.cpp F32))
    "inp_embd": ((1e-3, 1e-6), (1e-6, 1e-12), (1e-5, 1e-10)),
    "attn_norm": ((1.5e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10)),
    "Qcur": ((1e-1, 5e-3), (5e-4, 1e-8), (1e-5, 1e-10)),
    "Kcur": ((1e-1, 5e-3), (5e-4, 1e-8), (1e-5, 1e-10)),
    "Vcur": ((2e-1, 3e-2), (5e-4, 1e-8), (1e-5, 1e-10)),
    "Qcur_rope": ((1e-1, 5e-3), (5e-4, 1e-8), (1e-5, 1e-10)),
    "Kcur_rope": ((1e-1, 5e-3), (5e-4, 1e-8), (1e-5, 1e-10)),
    "kq": ((2e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10)),
    "kq_soft_max": ((3e-1, 3e-2), (5e-4, 1e-8), (1e-5, 1e-10)),
    "kqv_out": ((2e-1, 2e-2), (5e-4, 1e-8), (1e-5, 1e-10)),
    "attn_out": ((1.5e-1, 2e-2), (5e-4, 1e-8), (1e-5, 1e-10)),
    "ffn_inp": ((3e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10)),
    "ffn_norm": ((1.5e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10)),
    "ffn_gate": ((2e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10)),
    "ffn_up": ((1.5e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10)),
    "ffn_swiglu": ((2e-1, 2e-2), (5e-4, 1e-8), (1e-5, 1e-10)),
    "ffn_out": ((2e-1, 2e-2), (5e-4, 1e-8), (1e-5, 1e-10)),
    "l_out": ((3e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10)),
    "result_norm": ((1.5e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10)),
    "result_output": ((2e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10)),
}
TOLERANCES = {kind: {stage: row[i] for stage, row in _ROWS.items()} for i, kind in enumerate(REFERENCE_KINDS)}
