"""Granite 3 (dense): llama's block with four multipliers: the embeddings times `embedding_multiplier`
(`inp_scaled`), the softmax scale `attention_multiplier` (in place of HD^-1/2), each block's attention and
feed-forward outputs times `residual_multiplier` before they are added, and the logits divided by `logits_scaling`.

As llama.cpp's src/models/granite.cpp and transformers' modeling_granite.py compute them; llama.cpp multiplies the
logits by float32(1 / logits_scaling) where transformers divides (a last-bit difference), refllama as llama.cpp."""

from ..errors import RefllamaError
from . import blocks, tables
from .hparams import gguf_config, hf_config, refuse

NAME = "granite"
HF_ARCHITECTURES = ("GraniteForCausalLM",)
ROPE_LAYOUT = "interleaved"  # NORM: its converter (LlamaModel's) permutes HF's q/k rows

WEIGHTS = (tables.TOKEN_EMBD, tables.OUTPUT_NORM, tables.OUTPUT)
LAYER_WEIGHTS = tables.LLAMA_LAYER
INPUTS = ("inp_embd", "inp_scaled")
STAGES = blocks.pre_norm_stages()


def config_from_gguf(g):
    """`granite.logit_scale` is required (as llama.cpp reads it); the others default to no scaling, the softmax
    scale to HD^-1/2. llama.cpp turns RoPE off where rope.scaling.finetuned is false: refused by name."""
    a = NAME
    if g.has(f"{a}.rope.scaling.finetuned") and not g.fields[f"{a}.rope.scaling.finetuned"].value:
        raise RefllamaError(f"{g.path}: unsupported {a}.rope.scaling.finetuned false (Granite without RoPE)")
    attn = g.real(f"{a}.attention.scale", 0.0, positive=False)
    return gguf_config(g, ROPE_LAYOUT, embedding_scale=g.real(f"{a}.embedding_scale", 1.0),
                       residual_scale=g.real(f"{a}.residual_scale", 1.0), logit_scale=g.real(f"{a}.logit_scale"),
                       attn_scale=attn or None)


def config_from_hf(c):
    for option in ("attention_bias", "mlp_bias"):
        refuse(c, option, "Granite")
    m = {k: float(c.get(k, 1.0, kind=(int, float))) for k in (
        "embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling")}
    return hf_config(c, NAME, ROPE_LAYOUT, embedding_scale=m["embedding_multiplier"],
                     attn_scale=m["attention_multiplier"], residual_scale=m["residual_multiplier"],
                     logit_scale=m["logits_scaling"])


forward = blocks.pre_norm_forward  # llama's: the multipliers are settings of it (ModelConfig's embedding_scale,
# attn_scale, residual_scale, logit_scale)
