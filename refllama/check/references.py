"""Where llama.cpp and transformers compute a model differently, and which of the two computes it as its authors
defined it (docs/references.md, "Where the references disagree"): compare notes each difference that bears on the
dumps it compares when one side is llama.cpp's, so that a user caught between the two knows which to believe."""

import math

from ..layers import YARN_BETAS

GELU_STAGES = ("ffn_geglu", "ffn_gelu")


def is_llamacpp(d):
    return str(d.manifest.get("producer", "")).startswith("llama.cpp")


def notes(model, mine, ref, rows):
    """Lines for the report where a side is llama.cpp's and the model or a stage is one the two references compute
    differently."""
    sides = [side for side, d in (("MINE", mine), ("REF", ref)) if is_llamacpp(d)]
    if not sides or len(sides) == 2:
        return []
    out = []
    gelu = [r for r in rows if r["stage"] in GELU_STAGES and set(sides) & set(r["adds"])]
    if gelu:
        worst = max(gelu, key=lambda r: r["max_rel"])
        out.append(f"reference: llama.cpp ({sides[0]}) computes GELU from a float16 table (GGML_GELU_FP16: the input "
                   f"rounded to float16, the result a float16 number), the model's tanh GELU only to float16's "
                   f"precision: {worst['stage']} parts from float32 by up to {worst['max_rel']:.1e} here, and every "
                   "later stage carries it; transformers computes the model's GELU (docs/references.md). Compare "
                   "llama.cpp with --tolerance 'llama.cpp F32', or refllama --numerics ggml")
    if model is None:
        return out
    cfg = model.config
    differs = getattr(model.arch, "llamacpp_differs", None)  # a family's own difference, where it has one
    if differs is not None and differs(cfg):
        out.append(f"reference: {differs(cfg)}")
    if cfg.rope_yarn is not None and (cfg.rope_yarn != (*YARN_BETAS, True)
                                      or not math.isclose(cfg.rope_attn_factor, 1.0, rel_tol=1e-6)):
        out.append("reference: this model's YaRN is not llama.cpp's: llama.cpp ramps between beta_fast 32 and "
                   "beta_slow 1, always truncated, with an attention factor of 1 + 0.1 ln(factor), whatever the "
                   "config sets (it reads the GGUF's betas only for Grok); transformers follows the config "
                   "(docs/references.md)")
    return out
