"""Model hyper-parameters, read from the model file's metadata (never guessed from defaults in code)."""

import math
from dataclasses import dataclass, fields
from typing import NamedTuple

from .errors import RefllamaError


@dataclass(frozen=True)
class ModelConfig:
    """Everything a forward pass needs to know about a model; `arch` names its module in refllama.arch.

    Shape letters used across refllama: T tokens in a step, D = n_embd, H = n_head,
    KVH = n_head_kv, HD = head_dim, F = n_ff, V = vocab_size, S = cached length, R = rope_dim; in a mixture of
    experts E = n_expert, K = n_expert_used, FE = n_ff_exp, FS = n_ff_shexp; in linear attention LK, LV, LD, CK
    (linear_k_heads, linear_v_heads, linear_head_dim, conv_kernel) and C = 2 LK LD + LV LD, its conv's channels.
    """

    arch: str
    n_layer: int
    n_embd: int  # D
    n_head: int  # H
    n_head_kv: int  # KVH
    head_dim: int  # HD
    n_ff: int  # F
    vocab_size: int  # V
    n_ctx_train: int
    rms_eps: float
    rope_base: float
    rope_dim: int  # R: leading dims of each head that rotate (== HD unless partial rotary; 0: no RoPE, GPT-2)
    rope_layout: str  # q/k pair layout, llama.cpp's per architecture: "interleaved" (NORM) or "half" (NEOX)
    rope_scale: float = 1.0  # linear scaling: positions are divided by this
    rope_attn_factor: float = 1.0  # cos/sin multiplied by this (LongRoPE's attention factor)
    rope_ctx_orig: int | None = None  # LongRoPE: contexts beyond this take the long frequency factors; YaRN's
    rope_yarn: tuple | None = None  # YaRN: (beta_fast, beta_slow, truncate): frequencies blend from unscaled to
    # divided by rope_scale between the dims these give (layers.yarn_dims); cos and sin times yarn_mscale(rope_scale)
    # besides rope_attn_factor
    rope_mscale_in_kq: bool = False  # DeepSeek's YaRN (mscale_all_dim): its mscale squared is in attn_scale, cos and
    # sin times rope_attn_factor alone (llama.cpp's deepseek2 graph cancels yarn_mscale out of them)
    latent_eps: float | None = None  # the q/kv latents' RMSNorm epsilon where it is not rms_eps (transformers' MLA)
    tied_output: bool = False  # output projection reuses token_embd
    sliding_window: int | None = None  # a query sees only the last `sliding_window` keys (Mistral)
    swa_layers: tuple | None = None  # per layer, whether the window applies (Gemma 3); None: every layer, if set
    rope_base_swa: float | None = None  # RoPE base of the sliding-window layers (Gemma 3's local layers)
    attn_scale: float | None = None  # softmax scale of q.k; None: 1/sqrt(head_dim)
    logit_softcap: float | None = None  # logits = cap * tanh(logits / cap) (Gemma's final_logit_softcapping)
    attn_softcap: float | None = None  # scaled scores s = cap * tanh(s / cap) before the softmax (Gemma 2's)
    nope_layers: tuple | None = None  # per layer, whether q and k go unrotated (SmolLM3's NoPE layers)
    embedding_scale: float | None = None  # embeddings times this (`inp_scaled`: Gemma's sqrt(D), Granite's)
    residual_scale: float = 1.0  # each block's attention and feed-forward outputs times this (Granite's)
    logit_scale: float = 1.0  # logits divided by this (Granite's logits_scaling)
    n_expert: int = 0  # E: experts of a mixture-of-experts layer (0: every layer dense)
    n_expert_used: int = 0  # K: experts each token is routed to
    n_ff_exp: int | None = None  # FE: an expert's feed-forward width
    n_ff_shexp: int | None = None  # FS: the shared expert's width (Qwen2-MoE), None: no shared expert
    expert_norm: bool = False  # the K routing weights divided by their sum (Mixtral, Qwen3-MoE)
    expert_scale: float = 1.0  # the routing weights times this (llama.cpp's expert_weights_scale)
    moe_layers: tuple | None = None  # per layer, whether its feed-forward is a mixture of experts
    expert_gating: str = "softmax"  # how the router weighs the experts: "softmax" over all E, the K most probable
    # kept (llama.cpp's SOFTMAX); "softmax_weight": the K largest logits kept, a softmax over those K (gpt-oss's);
    # "sigmoid": each expert's own sigmoid (DeepSeek-V3's, GLM-4.5's)
    expert_bias: bool = False  # a selection bias (llama.cpp's exp_probs_b) added to the scores to choose the experts,
    # not to weigh them (DeepSeek-V3's, GLM-4.5's)
    expert_groups: int = 1  # DeepSeek-V3's expert groups: the experts in this many equal groups, a group scored by
    # the sum of its two best selection scores; only the `expert_groups_used` best groups' experts may be chosen
    expert_groups_used: int = 1
    oai_swiglu: tuple | None = None  # (alpha, limit): the experts' clamped SwiGLU, gpt-oss's: gate clamped above at
    # limit, up to [-limit, limit], gate * sigmoid(alpha gate) * (up + 1); None: SwiGLU
    recurrent_layers: tuple | None = None  # per layer, whether it is linear attention with a recurrent state (Gated
    # DeltaNet: Qwen3.5's) in place of attention over a KV cache
    linear_k_heads: int = 0  # LK: a linear-attention layer's q/k heads (llama.cpp's ssm.group_count)
    linear_v_heads: int = 0  # LV: its v heads (ssm.time_step_rank)
    linear_head_dim: int = 0  # LD: its heads' width, q, k and v alike (ssm.state_size)
    conv_kernel: int = 0  # CK: its causal convolution's kernel (ssm.conv_kernel)
    qk_norm: bool = False  # per-head q/k RMSNorms in a family where they are optional (GLM-4.5's 355B has them)
    q_lora_rank: int = 0  # multi-head latent attention (DeepSeek's MLA): q through a rank this low (0: one matrix)
    kv_lora_rank: int = 0  # KL: k and v through a latent this wide, cached (0: not MLA); each head's k is then
    # head_dim = NOPE + R wide (NOPE from the latent, R rotated from k_pe, shared by the heads), its v v_head_dim
    v_head_dim: int = 0  # VD: an MLA head's value width
    linear_v_order: str = "tiled"  # which q/k head v head h reads: "tiled" h % LK (Qwen3.5's files), "grouped"
    # h // (LV / LK) (Qwen3-Next's, and HF's)

    def is_nope(self, i):
        """Whether layer i leaves q and k unrotated."""
        return bool(self.nope_layers and self.nope_layers[i])

    def is_windowed(self, i):
        """Whether layer i's attention sees only the last `sliding_window` keys (every layer where the model gives
        no pattern: Mistral)."""
        return bool(self.sliding_window) and (self.swa_layers is None or bool(self.swa_layers[i]))

    def is_recurrent(self, i):
        """Whether layer i is linear attention (Gated DeltaNet) with a recurrent state."""
        return bool(self.recurrent_layers and self.recurrent_layers[i])

    def is_moe(self, i):
        """Whether layer i's feed-forward is a mixture of experts."""
        return bool(self.moe_layers and self.moe_layers[i])

    @property
    def kq_scale(self):
        return self.attn_scale if self.attn_scale is not None else 1.0 / math.sqrt(self.head_dim)

    def checked(self, path):
        """This config, or an error naming the first value no forward pass can run with (from file `path`)."""
        rules = {
            "count": ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "n_ff", "vocab_size", "n_ctx_train"),
            "positive": ("rms_eps", "rope_base", "rope_scale", "rope_attn_factor", "expert_scale", "residual_scale",
                         "logit_scale"),
            "optional": ("rope_base_swa", "attn_scale", "logit_softcap", "attn_softcap", "embedding_scale"),
        }
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in rules["count"] and not (isinstance(v, int) and v >= 1):
                raise RefllamaError(f"{path}: {f.name} must be a positive integer, got {v!r}")
            if f.name in rules["positive"] and not (isinstance(v, float) and math.isfinite(v) and v > 0):
                raise RefllamaError(f"{path}: {f.name} must be a finite positive number, got {v!r}")
            if f.name in rules["optional"] and v is not None and not (
                    isinstance(v, float) and math.isfinite(v) and v > 0):
                raise RefllamaError(f"{path}: {f.name} must be a finite positive number, got {v!r}")
            if f.name in ("rope_ctx_orig", "sliding_window", "n_ff_shexp") and v is not None and not (
                    isinstance(v, int) and v >= 1):
                raise RefllamaError(f"{path}: {f.name} must be a positive integer, got {v!r}")
        if self.n_head % self.n_head_kv:
            raise RefllamaError(f"{path}: {self.n_head} query heads do not divide into {self.n_head_kv} key/value "
                                "heads")
        if not isinstance(self.rope_dim, int) or not 0 <= self.rope_dim <= self.head_dim or self.rope_dim % 2:
            raise RefllamaError(f"{path}: rope dimension {self.rope_dim} must be even and at most the head "
                                f"dimension {self.head_dim}")
        if self.swa_layers is not None and (len(self.swa_layers) != self.n_layer or not self.sliding_window):
            raise RefllamaError(f"{path}: a sliding-window pattern needs a window and one entry per layer "
                                f"({len(self.swa_layers)} entries for {self.n_layer} layers)")
        if self.nope_layers is not None and len(self.nope_layers) != self.n_layer:
            raise RefllamaError(f"{path}: {len(self.nope_layers)} NoPE flags for {self.n_layer} layers")
        if self.moe_layers is not None and len(self.moe_layers) != self.n_layer:
            raise RefllamaError(f"{path}: {len(self.moe_layers)} mixture-of-experts flags for {self.n_layer} layers")
        if self.recurrent_layers is not None and len(self.recurrent_layers) != self.n_layer:
            raise RefllamaError(f"{path}: {len(self.recurrent_layers)} recurrent-layer flags for {self.n_layer} layers")
        if any(self.recurrent_layers or ()) and not (
                all(isinstance(n, int) and n >= 1 for n in (self.linear_k_heads, self.linear_v_heads,
                                                            self.linear_head_dim, self.conv_kernel))
                and self.linear_v_heads % self.linear_k_heads == 0):
            raise RefllamaError(f"{path}: linear attention needs positive head counts, v heads ({self.linear_v_heads}) "
                                f"a multiple of k heads ({self.linear_k_heads}), a head width and a conv kernel")
        if self.linear_v_order not in ("tiled", "grouped"):
            raise RefllamaError(f"{path}: unknown linear-attention v head order {self.linear_v_order!r}")
        if any(self.moe_layers or ()) and not (
                isinstance(self.n_ff_exp, int) and self.n_ff_exp >= 1 and 1 <= self.n_expert_used <= self.n_expert):
            raise RefllamaError(f"{path}: a mixture of experts needs 1 <= experts used ({self.n_expert_used}) <= "
                                f"experts ({self.n_expert}) and an expert width (got {self.n_ff_exp!r})")
        if self.expert_gating not in ("softmax", "softmax_weight", "sigmoid"):
            raise RefllamaError(f"{path}: unknown expert gating {self.expert_gating!r}")
        if self.expert_groups < 1 or not 1 <= self.expert_groups_used <= self.expert_groups or (
                self.n_expert % self.expert_groups) or (self.expert_groups > 1 and (
                self.n_expert // self.expert_groups < 2
                or self.n_expert_used > self.n_expert // self.expert_groups * self.expert_groups_used)):
            raise RefllamaError(f"{path}: {self.n_expert} experts in {self.expert_groups} groups, "
                                f"{self.expert_groups_used} used, cannot give {self.n_expert_used} experts a token "
                                "(each group needs 2 or more)")
        if self.kv_lora_rank and not (self.v_head_dim >= 1 and self.q_lora_rank >= 0 and self.rope_dim < self.head_dim):
            raise RefllamaError(f"{path}: latent attention needs a value width and a head wider than its rotated "
                                f"part (head {self.head_dim}, rotated {self.rope_dim}, value {self.v_head_dim})")
        if self.oai_swiglu is not None and not (len(self.oai_swiglu) == 2 and all(
                isinstance(v, float) and math.isfinite(v) and v > 0 for v in self.oai_swiglu)):
            raise RefllamaError(f"{path}: the clamped SwiGLU needs a positive alpha and limit, got {self.oai_swiglu!r}")
        if self.rope_yarn is not None and not (len(self.rope_yarn) == 3 and all(
                isinstance(v, float) and math.isfinite(v) and v > 0 for v in self.rope_yarn[:2])
                and isinstance(self.rope_yarn[2], bool) and self.rope_ctx_orig):
            raise RefllamaError(f"{path}: YaRN needs two positive betas, a truncation flag and an original context, "
                                f"got {self.rope_yarn!r}")
        if self.rope_layout not in ("interleaved", "half"):
            raise RefllamaError(f"{path}: unknown rope layout {self.rope_layout!r}")
        return self


class Loaded(NamedTuple):
    """What a loader returns, GGUF file or HF directory alike."""

    config: ModelConfig
    weights: dict  # name -> array; "layers": one dict per block (refllama.arch's tables name them)
    tokenizer: object  # refllama.formats.tokenizer.Tokenizer, or None (an HF directory without tokenizer.json)
    chat_template: str | None
    notices: list  # one-line messages for the user; `{backend}` in them stands for the backend's name
