"""GPT-2: the family with neither RoPE nor RMSNorm, as llama.cpp's src/models/gpt2.cpp and transformers'
modeling_gpt2.py compute it.

What differs from Llama:
  - positions are learned: a row of `position_embd` added to each token's embedding (`pos_embd`, `inpL`);
  - LayerNorm with a bias (mean removed, then scaled and shifted) where Llama has RMSNorm;
  - q, k and v in one matrix with a bias (`attn_qkv`, split at load), every head its own K/V (no GQA);
  - a plain GELU MLP with biases: up, gelu_tanh, down (`ffn_up`, `ffn_gelu`, `ffn_out`), no gate;
  - biases on every projection; the output tied to the embeddings.
HF stores its projections as Conv1D weights, [in, out]: they are transposed at load (as llama.cpp's converter does).
"""

from ..config import ModelConfig
from ..errors import RefllamaError, shown
from ..formats.ggml_types import GGUFValueType
from ..layers import embedding, linear
from ..trace import tap
from ..xp import array_module
from . import blocks, tables
from .hparams import block_count
from .tables import Weight

NAME = "gpt2"
HF_ARCHITECTURES = ("GPT2LMHeadModel",)
ROPE_LAYOUT = "half"  # no RoPE (rope_dim 0): q/k need no pair layout; recorded as "half", HF's and NEOX's
HF_LAYER = "transformer.h.{i}."

WEIGHTS = (
    Weight("token_embd", "V, D", "token_embd.weight", "transformer.wte.weight"),
    Weight("position_embd", "P, D", "position_embd.weight", "transformer.wpe.weight"),
    Weight("output_norm", "D", "output_norm.weight", "transformer.ln_f.weight"),
    Weight("output_norm_bias", "D", "output_norm.bias", "transformer.ln_f.bias"),
    Weight("output", "V, D", "output.weight", "lm_head.weight", required=False),  # absent: tied to token_embd
)
LAYER_WEIGHTS = (
    Weight("attn_norm", "D", "attn_norm.weight", "ln_1.weight"),
    Weight("attn_norm_bias", "D", "attn_norm.bias", "ln_1.bias"),
    Weight("attn_qkv", "3*D, D", "attn_qkv.weight", "attn.c_attn.weight", hf_transpose=True,
           split=(("attn_q", "D"), ("attn_k", "D"), ("attn_v", "D"))),
    Weight("attn_qkv_bias", "3*D", "attn_qkv.bias", "attn.c_attn.bias",
           split=(("attn_q_bias", "D"), ("attn_k_bias", "D"), ("attn_v_bias", "D"))),
    Weight("attn_output", "D, D", "attn_output.weight", "attn.c_proj.weight", hf_transpose=True),
    tables.ATTN_OUTPUT_BIAS._replace(hf="attn.c_proj.bias"),
    Weight("ffn_norm", "D", "ffn_norm.weight", "ln_2.weight"),
    Weight("ffn_norm_bias", "D", "ffn_norm.bias", "ln_2.bias"),
    Weight("ffn_up", "F, D", "ffn_up.weight", "mlp.c_fc.weight", hf_transpose=True),
    Weight("ffn_up_bias", "F", "ffn_up.bias", "mlp.c_fc.bias"),
    Weight("ffn_down", "D, F", "ffn_down.weight", "mlp.c_proj.weight", hf_transpose=True),
    Weight("ffn_down_bias", "D", "ffn_down.bias", "mlp.c_proj.bias"),
)
INPUTS = ("inp_embd", "pos_embd", "inpL")
STAGES = ("attn_norm", "Qcur", "Kcur", "Vcur", "kq", "kq_soft_max", "kqv_out", "attn_out", "ffn_inp", "ffn_norm",
          "ffn_up", "ffn_gelu", "ffn_out", "l_out")
# llama.cpp's gpt2 graph computes q, k, v as one product (`wqkv`, bias added as `wqkv_b`), split by columns
LLAMACPP_FUSED = {"wqkv": ("Qcur", "Kcur", "Vcur")}


def _config(path, n_layer, n_embd, n_head, n_ff, vocab, n_ctx, eps, tied):
    if n_head < 1 or n_embd % n_head:
        raise RefllamaError(f"{path}: embedding length {n_embd} does not split into {n_head} heads")
    return ModelConfig(arch=NAME, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head,
                       head_dim=n_embd // n_head, n_ff=n_ff, vocab_size=vocab, n_ctx_train=n_ctx, rms_eps=eps,
                       rope_base=1.0, rope_dim=0, rope_layout=ROPE_LAYOUT, tied_output=tied).checked(path)


def config_from_gguf(g):
    """`gpt2.*` metadata as llama.cpp reads it; the norm's eps is `attention.layer_norm_epsilon`."""
    tokens = g.array("tokenizer.ggml.tokens", (GGUFValueType.STRING,), "strings", required=True)

    def count(name):
        return int(g.integer(f"gpt2.{name}"))

    return _config(g.path, block_count(g, NAME), count("embedding_length"), count("attention.head_count"),
                   count("feed_forward_length"), len(tokens), count("context_length"),
                   g.real("gpt2.attention.layer_norm_epsilon", positive=True), "output.weight" not in g.tensors)


def config_from_hf(c):
    """GPT2LMHeadModel's config.json (n_embd, n_layer, n_head, n_inner, n_positions, layer_norm_epsilon)."""
    act = c.get("activation_function", "gelu_new", kind=(str,))
    if act not in ("gelu_new", "gelu_pytorch_tanh"):  # both the tanh approximation
        raise RefllamaError(f"{c.path}: unsupported activation_function {shown(act)} (supported: gelu_new)")
    for option in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if c.get(option, False, kind=(bool,)):
            raise RefllamaError(f"{c.path}: unsupported option '{option}': true (GPT-2)")
    if not c.get("scale_attn_weights", True, kind=(bool,)):
        raise RefllamaError(f"{c.path}: unsupported option 'scale_attn_weights': false (GPT-2)")
    D = c.need("n_embd", int)
    cfg = _config(c.path, c.need("n_layer", int), D, c.need("n_head", int), c.get("n_inner", 4 * D, kind=(int,)),
                  c.need("vocab_size", int), c.need("n_positions", int), float(c.need("layer_norm_epsilon")),
                  c.get("tie_word_embeddings", True, kind=(bool,)))
    return cfg, lambda: {}  # no RoPE tables


def forward(w, cfg, ops, tokens, start_pos, cache, last_only=False):  # [T] -> [T or 1, V] logits
    """GPT-2's forward: token and position embeddings, n_layer blocks of attention + GELU MLP, LayerNorm, logits."""
    T = len(tokens)
    cache.check_room(T)
    xp = array_module(w["output_norm"])
    if start_pos + T > cfg.n_ctx_train:
        raise RefllamaError(f"position {start_pos + T - 1} is past GPT-2's {cfg.n_ctx_train} learned positions")
    at = blocks.positions(cache, start_pos, T, xp)  # no RoPE: its tables are empty, only the mask is used

    x = tap("inp_embd", None, embedding(xp.asarray(tokens), w["token_embd"]))  # [T, D]
    pos = tap("pos_embd", None, embedding(xp.arange(start_pos, start_pos + T), w["position_embd"]))  # [T, D]
    x = tap("inpL", None, x + pos)
    for i, lw in enumerate(w["layers"]):
        x = block(x, lw, cfg, ops, i, at, last_only and i == cfg.n_layer - 1)  # [T, D] (last: [1, D])
    cache.n_past = start_pos + T

    x = tap("result_norm", None, ops.layer_norm(x, w["output_norm"], w["output_norm_bias"], cfg.rms_eps))  # [T, D]
    return tap("result_output", None, linear(x, w["output"]))  # [T, V]


def block(x, lw, cfg, ops, i, at, last_only=False):  # [T, D] -> [T, D] ([1, D]: last_only), layer i: attention,
    # then a GELU MLP, each after a LayerNorm
    h = tap("attn_norm", i, ops.layer_norm(x, lw["attn_norm"], lw["attn_norm_bias"], cfg.rms_eps))  # [T, D]
    q, k, v = blocks.qkv(h, lw, cfg, i)  # [T, H, HD] each (KVH = H), positions already in x
    h = blocks.attend(q, k, v, lw, cfg, ops, i, at)  # [T, D]
    if last_only:  # only the last row goes on (blocks.pre_norm_forward's)
        x, h = x[-1:], h[-1:]  # [1, D]
    x = tap("ffn_inp", i, x + h)  # [T, D]
    del h, q, k, v  # before the MLP's larger arrays
    h = tap("ffn_norm", i, ops.layer_norm(x, lw["ffn_norm"], lw["ffn_norm_bias"], cfg.rms_eps))  # [T, D]
    h = tap("ffn_up", i, linear(h, lw["ffn_up"], lw["ffn_up_bias"]))  # [T, F]
    h = tap("ffn_gelu", i, ops.gelu(h))  # [T, F]
    return tap("l_out", i, x + tap("ffn_out", i, linear(h, lw["ffn_down"], lw["ffn_down_bias"])))  # [T, D]
