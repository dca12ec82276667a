"""Hyper-parameter reads common to every family: GGUF metadata and HF config.json, each value checked for its type
and range, and the RoPE frequency factors they describe."""

import math

import numpy as np

from ..config import ModelConfig
from ..errors import RefllamaError, shown
from ..formats.ggml_types import GGUFValueType
from ..layers import YARN_BETAS, yarn_mscale


def block_count(g, arch):
    """`{arch}.block_count`, at most the file's tensor count (each block has tensors): a per-layer table sized by a
    corrupt count would be allocated before any tensor was found missing."""
    n = int(g.integer(f"{arch}.block_count"))
    if n > len(g.tensors):
        raise RefllamaError(f"{g.path}: metadata field '{arch}.block_count' is {n}, more blocks than the file's "
                            f"{len(g.tensors)} tensors")
    return n


def gguf_config(g, rope_layout, mscale_in_kq=False, **fields):
    """ModelConfig from the `{arch}.*` metadata keys every family shares, as llama.cpp reads them, each checked for
    its type and range; `fields` are the family's own; `mscale_in_kq`: the family reads YaRN's
    yarn_log_multiplier (DeepSeek's: its mscale in the softmax scale, which the family computes)."""
    arch = g.string("general.architecture", required=True)

    def count(name, default=None, low=1):  # a positive integer; required unless default is given
        return int(g.integer(f"{arch}.{name}", default, low=low))

    def real(name, default=None, positive=True):
        return g.real(f"{arch}.{name}", default, positive=positive)

    n_embd, n_head = count("embedding_length"), count("attention.head_count")
    n_tokens = len(g.array("tokenizer.ggml.tokens", (GGUFValueType.STRING,), "strings") or []) or None
    if n_tokens is None and not g.has(f"{arch}.vocab_size"):
        raise RefllamaError(f"{g.path}: missing metadata field '{arch}.vocab_size' (and no tokenizer.ggml.tokens)")
    vocab = count("vocab_size", n_tokens)
    scaling = g.string(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", "linear", "yarn"):
        raise RefllamaError(f"{g.path}: unsupported {arch}.rope.scaling.type {shown(scaling)} (supported: none, "
                            "linear, yarn)")
    window = count("attention.sliding_window", 0, low=0)
    head_dim, n_ctx = count("attention.key_length", n_embd // n_head), count("context_length")
    rope_dim, base = count("rope.dimension_count", head_dim), real("rope.freq_base", 10000.0)  # llama.cpp's default
    rope = {"rope_scale": real("rope.scaling.factor", 1.0) if scaling != "none" else 1.0,
            "rope_attn_factor": real("rope.scaling.attn_factor", 1.0),
            "rope_ctx_orig": count("rope.scaling.original_context_length", 0, low=0) or None}
    if scaling == "yarn":
        rope.update(gguf_yarn(g, arch, rope, n_ctx, mscale_in_kq))
    return ModelConfig(**{
        "arch": arch, "n_layer": block_count(g, arch), "n_embd": n_embd, "n_head": n_head,
        "n_head_kv": count("attention.head_count_kv", n_head), "head_dim": head_dim,
        "n_ff": count("feed_forward_length"), "vocab_size": vocab, "n_ctx_train": n_ctx,
        "rms_eps": real("attention.layer_norm_rms_epsilon"), "rope_base": base, "rope_dim": rope_dim, **rope,
        "rope_layout": rope_layout, "tied_output": "output.weight" not in g.tensors,
        "sliding_window": window or None, **fields}).checked(g.path)


def sqrt_scale(n_embd):
    """sqrt(D), Gemma's embedding factor: llama.cpp scales by sqrtf(D), transformers by a float32 tensor of sqrt(D),
    the same float32 number."""
    return float(np.float32(math.sqrt(n_embd)))


def gguf_swa(g, arch, n_layer, period):  # -> (window or 0, per-layer local flags or None)
    """A sliding window and which layers it applies to, as llama.cpp's load_swa_pattern reads them: an array of
    per-layer flags, or a period (every period-th layer global; 0: every layer local), `period` by default."""
    window = int(g.integer(f"{arch}.attention.sliding_window", 0, low=0))
    if not window:
        return 0, None
    key = f"{arch}.attention.sliding_window_pattern"
    if g.has(key) and g.fields[key].is_array:
        flags = g.array(key, (GGUFValueType.BOOL,), "bools")
        if len(flags) != n_layer:
            raise RefllamaError(f"{g.path}: metadata field '{key}' has {len(flags)} entries for {n_layer} layers")
        return window, tuple(bool(f) for f in flags)
    period = int(g.integer(key, period, low=0))
    return window, tuple(period == 0 or i % period < period - 1 for i in range(n_layer))


def hf_swa(c, n_layer, period):  # -> (window or None, per-layer local flags or None)
    """A config's sliding window and its `layer_types` (or, in older configs, `sliding_window_pattern`, the family's
    `period` by default: every period-th layer global)."""
    window = c.get("sliding_window", kind=(int,))
    types = c.get("layer_types", kind=(list,))
    if types is None:
        period = c.get("sliding_window_pattern", period, kind=(int,))
        if period < 1:
            raise RefllamaError(f"{c.path}: field 'sliding_window_pattern' must be at least 1, got {period}")
        types = ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(n_layer)]
    if not all(t in ("sliding_attention", "full_attention") for t in types):
        raise RefllamaError(f"{c.path}: field 'layer_types' must list sliding_attention or full_attention per layer")
    return window or None, tuple(t == "sliding_attention" for t in types) if window else None


def gguf_yarn(g, arch, rope, n_ctx, mscale_in_kq=False):
    """YaRN's fields from a GGUF file: the ramp from the original context (default: the training context) and the
    betas, the attention factor transformers' `attention_factor` was written as (yarn_attn_factor; cos and sin times
    it in place of yarn_mscale). llama.cpp reads the betas and yarn_attn_factor only for Grok (docs/references.md:
    refllama reads the model's); yarn_log_multiplier (DeepSeek's, Mistral 3's) is refused by name."""
    log_mul = f"{arch}.rope.scaling.yarn_log_multiplier"
    if g.has(log_mul) and g.real(log_mul, positive=False) != 0 and not mscale_in_kq:
        raise RefllamaError(f"{g.path}: unsupported {log_mul} {g.real(log_mul, positive=False):g} "
                            "(YaRN's mscale_all_dim)")
    betas = tuple(g.real(f"{arch}.rope.scaling.yarn_beta_{k}", d)
                  for k, d in zip(("fast", "slow"), YARN_BETAS, strict=True))
    yarn = {"rope_yarn": (*betas, True), "rope_ctx_orig": rope["rope_ctx_orig"] or n_ctx,
            "rope_mscale_in_kq": mscale_in_kq and g.real(log_mul, 0.0) != 0}
    key = f"{arch}.rope.scaling.yarn_attn_factor"
    if g.has(key):  # in place of yarn_mscale, which the numerics multiply in
        yarn["rope_attn_factor"] = rope["rope_attn_factor"] * g.real(key) / yarn_mscale(rope["rope_scale"])
    return yarn


GATING = {"softmax": 1, "sigmoid": 2, "softmax_weight": 3}  # ModelConfig.expert_gating -> its expert_gating_func


def gguf_moe(g, norm, split_ff=False, shared=0, every_layer=False, gating="softmax", deepseek=False):
    """The mixture-of-experts fields of a GGUF config ({} for a dense model), as llama.cpp reads them: `norm` is the
    family's renormalisation (llama.cpp's graph fixes it per architecture, no file key), `shared` the shared experts
    its graph computes (an expert_shared_count of another number is refused), `every_layer` whether its graph makes
    every layer a mixture (a layer without a router is then a missing tensor, not a dense layer); without an
    `expert_feed_forward_length` an expert is feed_forward_length wide, or (`split_ff`, Qwen's) that over K. A layer
    is a mixture where it has a router (`ffn_gate_inp`), as llama.cpp's llama graph decides per layer; `gating` the
    router's weighing (ModelConfig.expert_gating), which llama.cpp's graph fixes per architecture. Routing options
    refllama does not compute are refused by name.
    `deepseek`: DeepSeek-V3's routing, read from the file as llama.cpp's deepseek2 and glm4moe graphs read it: the
    gating function (`gating` where the file has none), renormalisation (expert_weights_norm), expert groups, a
    selection bias where the layers have one, expert_shared_count shared experts of the experts' width."""
    arch = g.string("general.architecture", required=True)
    n_expert = int(g.integer(f"{arch}.expert_count", 0, low=0))
    if not n_expert and every_layer:  # a graph of experts only: no dense feed-forward to fall back on
        raise RefllamaError(f"{g.path}: missing metadata field '{arch}.expert_count' (every layer of {arch} is a "
                            "mixture of experts)")
    if not n_expert:
        return {}
    fields = {}
    if deepseek:
        code = int(g.integer(f"{arch}.expert_gating_func", 0, low=0)) or GATING[gating]
        if code not in (GATING["softmax"], GATING["sigmoid"]):
            raise RefllamaError(f"{g.path}: unsupported {arch}.expert_gating_func {code} (supported: 1 softmax, "
                                "2 sigmoid)")
        gating = next(k for k, v in GATING.items() if v == code)
        norm = bool(g.flag(f"{arch}.expert_weights_norm", False))
        groups = int(g.integer(f"{arch}.expert_group_count", 1, low=1))
        fields = {"expert_groups": groups, "expert_groups_used": int(
            g.integer(f"{arch}.expert_group_used_count", groups, low=1)) if groups > 1 else 1,
                  "expert_bias": any(name.endswith("exp_probs_b.bias") for name in g.tensors)}
    checks = () if deepseek else ((f"{arch}.expert_group_count", 1), (f"{arch}.expert_shared_count", shared))
    for key, allowed in ((f"{arch}.expert_gating_func", GATING[gating]), *checks):
        if g.has(key) and int(g.integer(key, low=0)) not in (0, allowed):
            raise RefllamaError(f"{g.path}: unsupported {key} {g.integer(key, low=0)} (refllama routes this "
                                f"architecture by {gating}, ungrouped)")
    biased = sorted(name for name in g.tensors if name.endswith("exp_probs_b.bias"))
    if biased and not deepseek:
        raise RefllamaError(f"{g.path}: unsupported tensor {shown(biased[0])} (an expert selection bias)")
    n_layer = block_count(g, arch) - int(g.integer(f"{arch}.nextn_predict_layers", 0, low=0))
    scale = g.real(f"{arch}.expert_weights_scale", 0.0, positive=False)
    n_used, n_ff = int(g.integer(f"{arch}.expert_used_count", low=1)), int(g.integer(f"{arch}.feed_forward_length"))
    n_ff_exp = int(g.integer(f"{arch}.expert_feed_forward_length", n_ff // n_used if split_ff else n_ff))
    n_shared = int(g.integer(f"{arch}.expert_shared_count", 0, low=0)) if deepseek else 0
    return {"n_expert": n_expert, "n_expert_used": n_used, "n_ff_exp": n_ff_exp,
            "n_ff_shexp": int(g.integer(f"{arch}.expert_shared_feed_forward_length", low=1))
            if g.has(f"{arch}.expert_shared_feed_forward_length") else n_shared * n_ff_exp or None,
            "expert_norm": norm, "expert_scale": float(scale) if scale else 1.0, "expert_gating": gating,
            "moe_layers": tuple(every_layer or f"blk.{i}.ffn_gate_inp.weight" in g.tensors for i in range(n_layer)),
            **fields}


def hf_moe(c, norm_default, shared=False):
    """The mixture-of-experts fields of an HF config.json: expert counts under either name transformers has used,
    `norm_topk_prob` (default `norm_default`, the family's), the layers Qwen's configs keep dense (`mlp_only_layers`,
    and all but every `decoder_sparse_step`-th); Mixtral's expert width is intermediate_size."""
    n_expert = c.get("num_experts", None, kind=(int,)) or c.need("num_local_experts", int)
    n_layer, step = c.need("num_hidden_layers", int), c.get("decoder_sparse_step", 1, kind=(int,))
    if step < 1:
        raise RefllamaError(f"{c.path}: field 'decoder_sparse_step' must be at least 1, got {step}")
    only = c.get("mlp_only_layers", [], kind=(list,))
    dense_layers = {i for i in range(n_layer) if i in only or (i + 1) % step}
    return {"n_expert": n_expert, "n_expert_used": c.need("num_experts_per_tok", int),
            "n_ff_exp": c.get("moe_intermediate_size", None, kind=(int,)) or c.need("intermediate_size", int),
            "n_ff_shexp": c.need("shared_expert_intermediate_size", int) if shared else None,
            "expert_norm": c.get("norm_topk_prob", norm_default, kind=(bool,)),
            "moe_layers": tuple(i not in dense_layers for i in range(n_layer))}


def hf_deepseek_moe(c):
    """DeepSeek-V3's routing from its config.json (GLM-4.5's too), as transformers computes it: sigmoid scores (its
    modeling code reads no scoring_func), a selection bias, n_group groups of which topk_group are kept, the weights
    renormalised where norm_topk_prob says so and scaled by routed_scaling_factor, n_shared_experts shared experts of
    moe_intermediate_size each, the first first_k_dense_replace layers dense."""
    n_layer, n_expert = c.need("num_hidden_layers", int), c.need("n_routed_experts", int)
    dense, groups = c.get("first_k_dense_replace", 0, kind=(int,)), c.get("n_group", 1, kind=(int,))
    n_ff_exp, shared = c.need("moe_intermediate_size", int), c.get("n_shared_experts", 0, kind=(int,))
    return {"n_expert": n_expert, "n_expert_used": c.need("num_experts_per_tok", int), "n_ff_exp": n_ff_exp,
            "n_ff_shexp": shared * n_ff_exp or None, "expert_norm": c.get("norm_topk_prob", False, kind=(bool,)),
            "expert_scale": float(c.get("routed_scaling_factor", 1.0)), "expert_gating": "sigmoid",
            "expert_bias": True, "expert_groups": groups,
            "expert_groups_used": c.get("topk_group", groups, kind=(int,)) if groups > 1 else 1,
            "moe_layers": tuple(i >= dense for i in range(n_layer))}


def rope_parameters(c):
    """(theta, scaling dict or {}) from transformers 5's `rope_parameters` or transformers 4's
    top-level `rope_theta` + `rope_scaling`."""
    params = c.get("rope_parameters", kind=(dict,))
    if params is not None:
        return _number(params, "rope_theta", f"{c.path}: rope_parameters"), params
    return float(c.need("rope_theta")), c.get("rope_scaling", {}, kind=(dict,))


def _number(s, key, where):
    """s[key] as a finite float, or an error naming the field of the dict `where` describes."""
    v = s.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise RefllamaError(f"{where}: field '{key}' must be a finite number, got {shown(v)}")
    return float(v)


def _factors(s, key, n, where):  # -> [n] float64
    v = s.get(key)
    if not isinstance(v, list) or len(v) != n or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 for x in v):
        raise RefllamaError(f"{where}: field '{key}' must be a list of {n} positive numbers")
    return np.asarray(v, dtype=np.float64)


def llama3_freq_factors(theta, rope_dim, s, where):
    """Per-frequency divisors of Llama 3.1's RoPE scaling (transformers' _compute_llama3_parameters)."""
    factor, low, high, old_ctx = (_number(s, k, where) for k in (
        "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"))
    if not (factor > 0 and old_ctx > 0 and high > low > 0):
        raise RefllamaError(f"{where}: llama3 rope scaling needs factor > 0, high_freq_factor > low_freq_factor > 0")
    inv_freq = theta ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low) / (high - low)
    medium = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
    scaled = np.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    return inv_freq / scaled


def hf_config(c, arch, rope_layout, rope=None, act_key="hidden_act", act="silu", tied_default=False,
              partial_default=1.0, n_ff=None, packed=None, **fields):
    """(ModelConfig, rope) from the config.json fields every family shares; `fields` are the family's own,
    `rope` the family's (theta, scaling dict) where its config nests them, `act` the activation it computes,
    `partial_default` the share of a head RoPE rotates where the config does not say, `n_ff` the feed-forward's
    width where the config has no intermediate_size (a mixture of experts in every layer), `packed` the
    quantization_config method whose packed tensors the family's table reads (gpt-oss's "mxfp4").
    rope() computes the RoPE tensors {name: float32 array} the config describes: the loader calls it once the
    weights have confirmed the head dimension, so that no allocation is sized by the config alone. Unsupported
    options are refused by name, every value read is checked for its type and range."""
    quantized = c.get("quantization_config", kind=(dict,))
    if quantized is not None and quantized.get("quant_method") != packed:  # weights packed in a form not read
        raise RefllamaError(f"{c.path}: unsupported quantization_config {shown(quantized.get('quant_method'))} "
                            "(weights packed by a quantizer; refllama reads an HF directory's float weights, and "
                            "gpt-oss's MXFP4 experts)")
    D, H = c.need("hidden_size", int), c.need("num_attention_heads", int)
    if H < 1:
        raise RefllamaError(f"{c.path}: field 'num_attention_heads' must be at least 1, got {H}")
    # the only defaults taken are transformers' own documented ones, for fields older configs omit
    HD = c.get("head_dim", D // H, kind=(int,))
    theta, s = rope or rope_parameters(c)
    partial = s.get("partial_rotary_factor") if s and "partial_rotary_factor" in s else c.get(  # Qwen3.5: in the
        "partial_rotary_factor", partial_default, kind=(int, float))  # rope_parameters
    if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
        raise RefllamaError(f"{c.path}: field 'partial_rotary_factor' must be in (0, 1], got {shown(partial)}")
    rope_dim = int(HD * partial)
    where = f"{c.path}: rope scaling"
    kind = s.get("rope_type", s.get("type", "default")) if s else "default"
    n_ctx = c.need("max_position_embeddings", int)
    rope, linear_scale, attn_factor, ctx_orig, yarn = {}, 1.0, 1.0, None, None
    if kind == "linear":
        linear_scale = _number(s, "factor", where)
    elif kind == "llama3":
        rope["rope_freqs"] = lambda: llama3_freq_factors(theta, rope_dim, s, where)
    elif kind in ("longrope", "su"):  # Phi-3: short factors up to the original context, long ones beyond
        ctx_orig = s.get("original_max_position_embeddings") or c.need("original_max_position_embeddings", int)
        if not isinstance(ctx_orig, int) or isinstance(ctx_orig, bool) or ctx_orig < 1:
            raise RefllamaError(f"{where}: original_max_position_embeddings must be a positive integer")
        for part in ("short", "long"):  # lists from the file itself: checking them allocates nothing the file lacks
            factors = _factors(s, f"{part}_factor", rope_dim // 2, where)
            rope[f"rope_factors_{part}"] = lambda factors=factors: factors
        scale = n_ctx / ctx_orig  # the attention factor as llama.cpp's converter and transformers compute it
        attn_factor = _number(s, "attention_factor", where) if s.get("attention_factor") else (
            1.0 if scale <= 1.0 or ctx_orig == 1 else math.sqrt(1 + math.log(scale) / math.log(ctx_orig)))
    elif kind == "yarn":  # transformers' _compute_yarn_parameters
        ctx_orig = s.get("original_max_position_embeddings") or n_ctx
        if not isinstance(ctx_orig, int) or isinstance(ctx_orig, bool) or ctx_orig < 1:
            raise RefllamaError(f"{where}: original_max_position_embeddings must be a positive integer")
        linear_scale = _number(s, "factor", where) if s.get("factor") is not None else n_ctx / ctx_orig
        if linear_scale <= 0:
            raise RefllamaError(f"{where}: factor must be positive")
        attention = (_number(s, "attention_factor", where) if s.get("attention_factor") is not None else
                     yarn_mscale(linear_scale, _number(s, "mscale", where))
                     / yarn_mscale(linear_scale, _number(s, "mscale_all_dim", where))
                     if s.get("mscale") and s.get("mscale_all_dim") else yarn_mscale(linear_scale))
        attn_factor = attention / yarn_mscale(linear_scale)  # the numerics multiply yarn_mscale back in
        betas = tuple(_number(s, k, where) if s.get(k) else d
                      for k, d in zip(("beta_fast", "beta_slow"), YARN_BETAS, strict=True))
        truncate = s.get("truncate", True)
        if not isinstance(truncate, bool):
            raise RefllamaError(f"{where}: truncate must be true or false")
        yarn = (*betas, truncate)
    elif kind != "default":
        raise RefllamaError(f"{c.path}: unsupported rope scaling type {shown(kind)} "
                            "(supported: default, linear, llama3, longrope, yarn)")
    if c.get(act_key, act, kind=(str,)) != act:
        raise RefllamaError(f"{c.path}: unsupported {act_key} {shown(c.get(act_key))} (supported: {act})")
    cfg = ModelConfig(**{
        "arch": arch, "n_layer": c.need("num_hidden_layers", int), "n_embd": D, "n_head": H,
        "n_head_kv": c.get("num_key_value_heads", H, kind=(int,)), "head_dim": HD,
        "n_ff": c.get("intermediate_size", kind=(int,)) or n_ff or c.need("intermediate_size", int),
        "vocab_size": c.need("vocab_size", int), "n_ctx_train": n_ctx,
        "rms_eps": float(c.need("rms_norm_eps")), "rope_base": theta, "rope_dim": rope_dim,
        "rope_scale": linear_scale, "rope_attn_factor": float(attn_factor), "rope_ctx_orig": ctx_orig,
        "rope_yarn": yarn, "rope_layout": rope_layout,
        "tied_output": c.get("tie_word_embeddings", tied_default, kind=(bool,)),
        **fields})
    return cfg.checked(c.path), lambda: {k: f().astype(np.float32) for k, f in rope.items()}


def refuse(c, option, family):
    """An HF config option refllama does not implement, set true: a one-line error naming it."""
    if c.get(option, False, kind=(bool,)):
        raise RefllamaError(f"{c.path}: unsupported option '{option}': true ({family})")


def freq_factors(w, cfg, n_ctx):  # -> [R/2] float32 or None
    """RoPE frequency divisors for a context of n_ctx: llama3-style `rope_freqs`, or LongRoPE's long factors
    when the context exceeds the original one and its short factors otherwise, as llama.cpp chooses them."""
    if ("rope_factors_short" in w) != ("rope_factors_long" in w):
        raise RefllamaError("the model has one of rope_factors_short and rope_factors_long, not both")
    if "rope_factors_short" in w:
        return w["rope_factors_long"] if n_ctx > (cfg.rope_ctx_orig or cfg.n_ctx_train) else w["rope_factors_short"]
    return w.get("rope_freqs")
