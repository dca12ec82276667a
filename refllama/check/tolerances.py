"""The checkpoint tolerances: per stage, (max_rel, nmse) for each column, in REFERENCE_KINDS order.

max_rel = max |ours - reference| / (max - min of the reference); nmse = sum((ours - reference)^2) / sum(reference^2).
Why each number is what it is: checkpoints/README.md, whose table a test keeps equal to this one.
Columns: "llama.cpp", its quantized arithmetic (8-bit activations, f16 KV cache); "float32", two float32 engines on
the same weights (transformers, refllama, any fp32 engine); "llama.cpp F32", llama.cpp on F32 weights with an F32
KV cache; "ggml", two engines that both compute llama.cpp's CPU arithmetic (refllama's numerics "ggml", a ggml
port) on the same quantized GGUF. Engines that compute in bfloat16 or float16 get bands derived from that format's
rounding, `rounding_bands`.
"""

REFERENCE_KINDS = ("llama.cpp", "float32", "llama.cpp F32", "ggml")
_ROWS = {  # stage: ((llama.cpp), (float32), (llama.cpp F32), (ggml))
    "inp_embd": ((1e-3, 1e-6), (1e-6, 1e-12), (1e-5, 1e-10), (1e-5, 1e-10)),
    "inp_scaled": ((1e-3, 1e-6), (1e-6, 1e-12), (1e-5, 1e-10), (1e-5, 1e-10)),
    "pos_embd": ((1e-3, 1e-6), (1e-6, 1e-12), (1e-5, 1e-10), (1e-5, 1e-10)),
    "inpL": ((1e-3, 1e-6), (1e-6, 1e-12), (1e-5, 1e-10), (1e-5, 1e-10)),
    "attn_norm": ((1.5e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "Qcur": ((1e-1, 5e-3), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "Kcur": ((1e-1, 5e-3), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "Vcur": ((2e-1, 3e-2), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "Qcur_rope": ((1e-1, 5e-3), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "Kcur_rope": ((1e-1, 5e-3), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "kq": ((2e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "kq_soft_max": ((3e-1, 3e-2), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "kqv_out": ((2e-1, 2e-2), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "attn_out": ((1.5e-1, 2e-2), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "attn_post_norm": ((1.5e-1, 3e-2), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "sa_out": ((3e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "ffn_inp": ((3e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "ffn_norm": ((1.5e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "ffn_gate": ((2e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "ffn_up": ((1.5e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "ffn_swiglu": ((2e-1, 2e-2), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "ffn_geglu": ((2e-1, 2e-2), (5e-4, 1e-8), (1e-3, 1e-6), (1e-5, 1e-10)),
    "ffn_gelu": ((2e-1, 2e-2), (5e-4, 1e-8), (1e-3, 1e-6), (1e-5, 1e-10)),
    "ffn_out": ((2e-1, 2e-2), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "ffn_post_norm": ((1.5e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "l_out": ((3e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "result_norm": ((1.5e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10), (1e-5, 1e-10)),
    "result_output": ((2e-1, 1e-2), (5e-4, 1e-8), (1e-5, 1e-10), (1e-4, 1e-8)),
}
SHARED_ROW = {  # stages that take another's row: q/k norms their projection's; a mixture of experts' the dense
    # feed-forward stage it computes as (each expert's product, the router's too, a product of ffn_norm) or a softmax's
    "Qcur_normed": "Qcur", "Kcur_normed": "Kcur", "kq_scaled_2": "kq",
    "ffn_moe_logits": "ffn_gate", "ffn_moe_topk": "ffn_gate", "ffn_shexp_gate_inp": "ffn_gate",
    "ffn_moe_probs": "kq_soft_max", "ffn_moe_weights": "kq_soft_max", "ffn_moe_weights_sum": "kq_soft_max",
    "ffn_moe_weights_norm": "kq_soft_max", "ffn_shexp_gate": "kq_soft_max",
    "ffn_moe_gate": "ffn_gate", "ffn_moe_up": "ffn_up", "ffn_moe_swiglu": "ffn_swiglu", "ffn_moe_down": "ffn_out",
    "ffn_moe_weighted": "ffn_out", "ffn_moe_out": "ffn_out", "ffn_shexp": "ffn_out", "ffn_shexp_out": "ffn_out",
    # gpt-oss's: the K weights' softmax as a softmax's, each expert product's bias as the product's, its SwiGLU's
    "ffn_moe_weights_softmax": "kq_soft_max", "ffn_moe_gate_biased": "ffn_gate", "ffn_moe_up_biased": "ffn_up",
    "ffn_moe_swiglu_oai": "ffn_swiglu", "ffn_moe_down_biased": "ffn_out",
    # DeepSeek-V3's and GLM-4.5's: sigmoid scores, biased and masked, as a softmax's; the groups chosen as the experts
    "ffn_moe_probs_biased": "kq_soft_max", "ffn_moe_probs_masked": "kq_soft_max", "ffn_moe_group_topk": "ffn_gate",
    "ffn_moe_weights_scaled": "kq_soft_max",
    # latent attention's: its projections as q's and k's, its rotated parts as theirs, the latent's norms as a norm's,
    # the heads' mix of latents as kqv_out
    "q": "Qcur", "q_nope": "Qcur", "q_a_norm": "ffn_norm", "kv_cmpr_pe": "Kcur", "kv_cmpr": "ffn_norm", "kv": "Kcur",
    "q_pe": "Qcur_rope", "k_pe": "Kcur_rope", "q_nope_absorbed": "Qcur", "kqv": "kqv_out",
    # the hybrids': projections of attn_norm as q's or the gate's; elementwise steps as the SwiGLU's; the conv as up's;
    # L2 norms as a norm's; the delta rule's and the attention's outputs before their gates as kqv_out's
    "Qcur_full": "Qcur", "linear_attn_qkv_mixed": "Qcur", "z": "ffn_gate", "beta": "ffn_gate", "alpha": "ffn_gate",
    "beta_sigmoid": "ffn_swiglu", "a_softplus": "ffn_swiglu", "gate": "ffn_swiglu", "conv_output_raw": "ffn_up",
    "conv_output_silu": "ffn_swiglu", "q_conv": "ffn_swiglu", "k_conv": "ffn_swiglu", "v_conv": "ffn_swiglu",
    "q_conv_predelta": "ffn_norm", "k_conv_predelta": "ffn_norm", "attn_output": "kqv_out", "attn_pregate": "kqv_out",
    "final_output": "ffn_swiglu", "linear_attn_out": "attn_out", "gate_sigmoid": "ffn_swiglu",
    "attn_gated": "ffn_swiglu", "shared_expert_gate": "ffn_gate", "shared_expert_gate_sigmoid": "kq_soft_max",
    "ffn_shexp_gated": "ffn_out", "linear_attn_mixed_ba": "ffn_gate", "b": "ffn_gate", "a": "ffn_gate",
}
TOLERANCES = {kind: {stage: row[i] for stage, row in _ROWS.items()} for i, kind in enumerate(REFERENCE_KINDS)}

UNIT_ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}  # half the spacing of floats in [1, 2)


def rounding_bands(numerics):
    """(max_rel, nmse) for one stage of an engine computing in `numerics` (bfloat16, float16), re-run by refllama
    on that engine's own inputs: its weights and its output each rounded once. A correct bfloat16 engine
    (tests/engine.py, SmolLM2, three prompts) measured at most 1.3 u max_rel and 0.6 u^2 NMSE at any stage of any
    layer; the bands are 8 u and 4 u^2. End to end, errors grow with depth; see `band`."""
    u = UNIT_ROUNDOFF[numerics]
    return (8 * u, 4 * u * u)


def band(column, stage, end_to_end=False):
    """(max_rel, nmse) for `stage` in a column of the table or a rounding format's; None for a stage no row covers.
    A rounding format end to end (no model to re-run stages with) takes, per stage, the larger of its own band
    and the llama.cpp column's, whose 8-bit activations drift through the layers like bfloat16's rounding."""
    if column in UNIT_ROUNDOFF:
        own = rounding_bands(column)
        if not end_to_end:
            return own
        drift = band("llama.cpp", stage) or own
        return (max(own[0], drift[0]), max(own[1], drift[1]))
    return TOLERANCES[column].get(SHARED_ROW.get(stage, stage))
