"""SmolLM3: llama's forward (blocks.pre_norm_forward) with NoPE layers: every 4th layer attends with q and k left
unrotated (no `Qcur_rope`/`Kcur_rope` there), GQA, a tied head.

llama.cpp's smollm3 graph fixes the NoPE layers at every 4th (n_no_rope_layer_step = 4: no file key), and its
converter (LlamaModel's) writes none; transformers reads `no_rope_layers` (1: rotate), or `no_rope_layer_interval`.
A GGUF file therefore always has llama.cpp's pattern: a model made with another list is only right from its HF
directory (docs/references.md)."""

from ..errors import RefllamaError
from . import blocks, tables
from .hparams import block_count, gguf_config, hf_config, refuse

NAME = "smollm3"
HF_ARCHITECTURES = ("SmolLM3ForCausalLM",)
ROPE_LAYOUT = "interleaved"  # NORM: its converter (LlamaModel's) permutes HF's q/k rows, as llama's
NOPE_INTERVAL = 4  # llama.cpp's n_no_rope_layer_step, transformers' no_rope_layer_interval default

WEIGHTS = (tables.TOKEN_EMBD, tables.OUTPUT_NORM, tables.OUTPUT)
LAYER_WEIGHTS = tables.LLAMA_LAYER
INPUTS, STAGES = blocks.PRE_NORM_INPUTS, blocks.pre_norm_stages()  # a NoPE layer lacks Qcur_rope, Kcur_rope


def nope(n_layer, interval):  # -> per layer, whether it is a NoPE layer: every interval-th
    return tuple((i + 1) % interval == 0 for i in range(n_layer))


def llamacpp_differs(cfg):  # -> why llama.cpp computes another model than this config's, or None
    if cfg.nope_layers == nope(cfg.n_layer, NOPE_INTERVAL):
        return None
    return ("this model's NoPE layers are not llama.cpp's: its smollm3 graph leaves every 4th layer unrotated "
            "whatever the config lists (its converter writes no list), so llama.cpp computes another model; "
            "transformers follows no_rope_layers (docs/references.md)")


def config_from_gguf(g):
    return gguf_config(g, ROPE_LAYOUT, nope_layers=nope(block_count(g, NAME), NOPE_INTERVAL))


def config_from_hf(c):
    """`no_rope_layers` (a 1 or 0 a layer, 1: RoPE), else every `no_rope_layer_interval`-th layer NoPE."""
    for option in ("use_sliding_window", "attention_bias", "mlp_bias"):
        refuse(c, option, "SmolLM3")
    n_layer = c.need("num_hidden_layers", int)
    flags = c.get("no_rope_layers", kind=(list,))
    if flags is None:
        interval = c.get("no_rope_layer_interval", NOPE_INTERVAL, kind=(int,))
        if interval < 1:
            raise RefllamaError(f"{c.path}: field 'no_rope_layer_interval' must be at least 1, got {interval}")
        layers = nope(n_layer, interval)
    elif len(flags) != n_layer or not all(f in (0, 1) and not isinstance(f, float) for f in flags):
        raise RefllamaError(f"{c.path}: field 'no_rope_layers' must list 1 (RoPE) or 0 (NoPE) for each of {n_layer} "
                            "layers")
    else:
        layers = tuple(not f for f in flags)
    return hf_config(c, NAME, ROPE_LAYOUT, tied_default=True, nope_layers=layers)


forward = blocks.pre_norm_forward
