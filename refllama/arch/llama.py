"""Llama (and Mistral, SmolLM2, and Mixtral: a `llama` file whose layers have routers and experts): llama.cpp's
`llama` architecture. Its forward is blocks.pre_norm_forward, read
top to bottom there: embeddings, n_layer blocks of attention + SwiGLU, norm, logits. Qwen2, Qwen3 and Phi-3 share
it; they differ only in data.

Each stage is handed to `tap` under llama.cpp's graph name (a no-op unless a trace is recording); where
llama.cpp gives two tensors one name, refllama adds a suffix (`Qcur_rope`, `Kcur_rope`).
"""

from . import blocks, tables
from .hparams import gguf_config, gguf_moe, hf_config, hf_moe
from .tables import Weight

NAME = "llama"
HF_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM")
ROPE_LAYOUT = "interleaved"  # llama.cpp's rope mode NORM; its converter permutes HF's q/k rows to it

WEIGHTS = (  # key, shape, GGUF name, HF name, required
    tables.TOKEN_EMBD,
    tables.OUTPUT_NORM,
    tables.OUTPUT,
    Weight("rope_freqs", "R/2", "rope_freqs.weight", None, required=False),  # Llama 3.1's frequency divisors
)
LAYER_WEIGHTS = (  # a block's, after blk.N. / model.layers.N.
    *tables.LLAMA_LAYER,
    # Llama's attention_bias and mlp_bias options
    tables.ATTN_Q_BIAS._replace(required=False, hf_permute="H"),
    tables.ATTN_K_BIAS._replace(required=False, hf_permute="KVH"),
    tables.ATTN_V_BIAS._replace(required=False),
    Weight("attn_output_bias", "D", "attn_output.bias", "self_attn.o_proj.bias", required=False),
    Weight("ffn_gate_bias", "F", "ffn_gate.bias", "mlp.gate_proj.bias", required=False),
    Weight("ffn_up_bias", "F", "ffn_up.bias", "mlp.up_proj.bias", required=False),
    Weight("ffn_down_bias", "D", "ffn_down.bias", "mlp.down_proj.bias", required=False),
)
MOE_WEIGHTS = tuple(row._replace(hf=hf, hf_fused=()) for row, hf in zip(tables.MOE, (  # Mixtral: renormalised
    "block_sparse_moe.gate.weight", "block_sparse_moe.experts.{e}.w1.weight", "block_sparse_moe.experts.{e}.w3.weight",
    "block_sparse_moe.experts.{e}.w2.weight"), strict=True))
INPUTS, STAGES = blocks.PRE_NORM_INPUTS, blocks.pre_norm_stages()


def config_from_gguf(g):
    """A `llama` GGUF; files converted from Mistral may carry `llama.attention.sliding_window`, Mixtral's have
    experts (renormalised, as llama.cpp's llama graph computes them) in every layer with a router."""
    return gguf_config(g, ROPE_LAYOUT, **gguf_moe(g, norm=True))


def config_from_hf(c):
    """LlamaForCausalLM, MistralForCausalLM with its sliding window, MixtralForCausalLM with its experts."""
    kind = c.get("architectures")[0]
    window = c.get("sliding_window", kind=(int,)) if kind in ("MistralForCausalLM", "MixtralForCausalLM") else None
    moe = hf_moe(c, norm_default=True) if kind == "MixtralForCausalLM" else {}
    return hf_config(c, NAME, ROPE_LAYOUT, sliding_window=int(window) if window else None, **moe)


forward = blocks.pre_norm_forward
