"""Qwen3.5 (dense: 0.8B to 27B; Qwen3.6's dense models too): a hybrid, llama.cpp's `qwen35` graph. Three of every four
layers are linear attention (Gated DeltaNet, hybrid.linear_attention), whose conv and delta states the cache carries
in place of K/V; the fourth is full attention with a sigmoid output gate, Qwen3's per-head q/k norms and a quarter of
each head rotated (hybrid.gated_attention). Its M-RoPE sections (the same position for text in each) reduce to one
NEOX rotation. Every block is Llama's pre-norm block around them (hybrid.hybrid_block), a SwiGLU feed-forward after.

HF stores each RMSNorm weight as w for a (1 + w) weight, but the gated norm's (as llama.cpp's converter adds 1), A_log
for the decay's -exp(A_log), the conv [C, 1, CK]; where there are more v heads than k heads, the v heads grouped by k
head, which the converter reorders to llama.cpp's tiled order: refllama does the same at load (tables.tiled)."""

from ..errors import RefllamaError
from ..formats.ggml_types import GGUFValueType
from . import blocks, hybrid, tables
from .hparams import block_count, gguf_config, hf_config, refuse

NAME = "qwen35"
HF_ARCHITECTURES = ("Qwen3_5ForCausalLM",)
ROPE_LAYOUT = "half"  # llama.cpp's IMROPE: NEOX pairs, one position stream for text
FULL_ATTENTION_INTERVAL = 4  # every 4th layer full attention, where a file lists no recurrent layers (llama.cpp's)

WEIGHTS = (tables.TOKEN_EMBD, tables.OUTPUT_NORM._replace(hf_add=1.0), tables.OUTPUT)
LAYER_WEIGHTS = (*tables.GATED_ATTENTION, tables.QWEN35_FFN_NORM, tables.FFN_GATE, tables.FFN_UP, tables.FFN_DOWN)
RECURRENT_WEIGHTS = (*tables.GATED_DELTA_NET, tables.QWEN35_FFN_NORM, tables.FFN_GATE, tables.FFN_UP,
                     tables.FFN_DOWN)
INPUTS, STAGES, WIRING = blocks.PRE_NORM_INPUTS, hybrid.hybrid_stages(), hybrid.WIRING
LLAMACPP_NAMES = hybrid.LLAMACPP_NAMES


def block_stages(cfg, i):
    return hybrid.block_stages(STAGES, cfg, i)


def linear_fields(n_layer, recurrent, path, **sizes):  # -> ModelConfig's linear-attention fields, checked
    if len(recurrent) != n_layer:
        raise RefllamaError(f"{path}: {len(recurrent)} layer types for {n_layer} layers")
    return {"recurrent_layers": tuple(recurrent), **sizes}


def config_from_gguf(g):
    """The `qwen35.ssm.*` sizes as llama.cpp reads them (its v heads as wide as its k heads: state_size both),
    the recurrent layers as listed, or every layer but each FULL_ATTENTION_INTERVAL-th."""
    n = lambda key, default=None: int(g.integer(f"{NAME}.{key}", default))  # noqa: E731
    n_layer = block_count(g, NAME)
    if g.has(f"{NAME}.attention.recurrent_layers"):
        recurrent = g.array(f"{NAME}.attention.recurrent_layers", (GGUFValueType.BOOL,), "bools")
    else:
        every = n("full_attention_interval", FULL_ATTENTION_INTERVAL)
        recurrent = [(i + 1) % every != 0 for i in range(n_layer)]
    LD, LV = n("ssm.state_size"), n("ssm.time_step_rank")
    if n("ssm.inner_size") != LV * LD:
        raise RefllamaError(f"{g.path}: metadata field '{NAME}.ssm.inner_size' is {n('ssm.inner_size')}, not "
                            f"{LV} v heads x {LD} (ssm.state_size)")
    return gguf_config(g, ROPE_LAYOUT, **linear_fields(
        n_layer, recurrent, g.path, linear_k_heads=n("ssm.group_count"), linear_v_heads=LV, linear_head_dim=LD,
        conv_kernel=n("ssm.conv_kernel")))


def config_from_hf(c):
    """Qwen3_5TextConfig's fields: `layer_types` (or every full_attention_interval-th layer full), the linear
    attention's heads (k and v heads as wide, as llama.cpp computes them), a quarter of each head rotated by default."""
    refuse(c, "attention_bias", "Qwen3.5")
    n_layer = c.need("num_hidden_layers", int)
    types = c.get("layer_types", kind=(list,))
    if types is None:
        every = c.get("full_attention_interval", FULL_ATTENTION_INTERVAL, kind=(int,))
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n_layer)]
    if not all(t in ("linear_attention", "full_attention") for t in types):
        raise RefllamaError(f"{c.path}: field 'layer_types' must list linear_attention or full_attention per layer")
    LD = c.need("linear_key_head_dim", int)
    if c.need("linear_value_head_dim", int) != LD:
        raise RefllamaError(f"{c.path}: linear_value_head_dim {c.get('linear_value_head_dim')} differs from "
                            f"linear_key_head_dim {LD} (llama.cpp's delta rule needs them equal)")
    return hf_config(c, NAME, ROPE_LAYOUT, partial_default=0.25, **linear_fields(
        n_layer, [t == "linear_attention" for t in types], c.path, linear_k_heads=c.need("linear_num_key_heads", int),
        linear_v_heads=c.need("linear_num_value_heads", int), linear_head_dim=LD,
        conv_kernel=c.need("linear_conv_kernel_dim", int)))


def forward(w, cfg, ops, tokens, start_pos, cache, last_only=False):  # [T] -> [T or 1, V] logits
    """blocks.decoder_forward of hybrid.hybrid_block: embeddings, n_layer hybrid blocks, a last norm, logits."""
    return blocks.decoder_forward(w, cfg, ops, tokens, start_pos, cache, last_only, hybrid.hybrid_block)
