"""A decode step on the GPU as one CUDA graph: blocks.pre_norm_forward (or gemma3.forward) for one token, written as
a fixed sequence of kernels (refllama.numerics.gpu) on buffers allocated once, captured once and replayed for every
token. The step reads its token and position from two device scalars and attends over the keys up to that position,
so one graph serves every position; nothing waits for the GPU until the caller reads the logits. Traces and dumps
take the ungraphed forward (refllama.arch), which this step equals within float32 rounding (tests/test_gpu.py).

On NumPy the same sequence runs on the kernels' NumPy mirrors, uncaptured: that is how the CPU tests check it.
"""

import sys
from typing import NamedTuple

from ..arch import blocks, gemma3
from ..xp import array_module
from .gpu import GpuMatrix, kernels

QKV, GATE_UP = ("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up")


def eligible(model):
    """Whether the graph reproduces this model's decode step: float32 arithmetic, a pre-norm forward (Llama,
    Mistral, Qwen2, Qwen3, Phi-3) without Granite's multipliers or Gemma 3's, no experts, q/k norms (if any) per
    head, no attention sinks."""
    cfg, lw = model.config, model.weights["layers"][0]
    per_head = "attn_q_norm" not in lw or lw["attn_q_norm"].shape[0] == cfg.head_dim
    gemma = model.arch.forward is gemma3.forward
    unscaled = cfg.residual_scale == cfg.logit_scale == 1.0 and (cfg.embedding_scale is None or gemma)
    return (model.numerics == "float32" and (model.arch.forward is blocks.pre_norm_forward or gemma) and unscaled
            and not cfg.nope_layers and per_head and cfg.head_dim <= 1024 and "attn_sinks" not in lw
            and not any(cfg.is_moe(i) for i in range(cfg.n_layer)))


def join_rows(lw, names):  # -> [sum of N, K], or its parts [(matrix, first row, end)]
    """One matrix for the step's one product where the forward has several, where they are of one kind (GpuMatrix
    of one stored type, or float32 arrays): each name of the layer becomes a view of its rows of it, so the model
    holds no second copy. Matrices of several kinds (a GGUF's Q4_K q/k beside a Q6_K v) stay as they are, and the
    step multiplies each into its rows of the output."""
    parts = [lw[n] for n in names]
    starts = [0]
    for p in parts:
        starts.append(starts[-1] + p.shape[0])
    kinds = {p.kind if isinstance(p, GpuMatrix) else "f32" for p in parts}
    if len(kinds) > 1:
        return list(zip(parts, starts[:-1], starts[1:], strict=True))
    if kinds == {"f32"}:
        whole = array_module(parts[0]).concatenate(parts)
        lw.update((n, whole[a:b]) for n, a, b in zip(names, starts[:-1], starts[1:], strict=True))
    else:
        whole = GpuMatrix(parts[0].xp.concatenate([p.raw for p in parts]), parts[0].kind, parts[0].scratch)
        lw.update((n, whole.rows(a, b)) for n, a, b in zip(names, starts[:-1], starts[1:], strict=True))
    return whole


def joined_bias(lw, names, xp):  # -> [sum of N] or None: the matrices' biases side by side, zeros where one has none
    if not any(n + "_bias" in lw for n in names):
        return None
    return xp.concatenate([lw.get(n + "_bias", xp.zeros(lw[n].shape[0], xp.float32)) for n in names])


class Layer(NamedTuple):
    """A block's weights as the step reads them, and where its attention looks."""

    local: bool  # a sliding-window layer (Gemma 3's local layers; every layer of Mistral's)
    attn_norm: object  # [D]
    qkv: object  # [QKV, D] (or its parts: join_rows)
    qkv_bias: object  # [QKV] or None
    q_norm: object  # [HD] or None (Qwen3)
    k_norm: object
    attn_output: object  # [D, H*HD]
    attn_output_bias: object
    ffn_norm: object  # [D]
    gate_up: object  # [2F, D] (or its parts)
    gate_up_bias: object
    ffn_down: object  # [D, F]
    ffn_down_bias: object
    attn_post_norm: object  # [D], Gemma 3's norms of the attention's and the feed-forward's outputs; else None
    ffn_post_norm: object


class GraphDecoder:
    """The decode step of a loaded model (one whose `eligible` is true), its buffers and, on a GPU, its graph.
    `step(token, pos)` -> [1, V] logits, the cache's K/V written at `pos` as the forward writes them."""

    def __init__(self, model):
        cfg, w, cache, xp = model.config, model.weights, model.cache, model.xp
        self.k, self.xp, self.cfg, self.cache = kernels(xp), xp, cfg, cache
        self.heads = (cfg.n_head, cfg.n_head_kv, cfg.head_dim)
        gemma = model.arch is gemma3
        self.layers = [Layer(cfg.is_windowed(i),
                             lw["attn_norm"], join_rows(lw, QKV), joined_bias(lw, QKV, xp), lw.get("attn_q_norm"),
                             lw.get("attn_k_norm"), lw["attn_output"], lw.get("attn_output_bias"), lw["ffn_norm"],
                             join_rows(lw, GATE_UP), joined_bias(lw, GATE_UP, xp), lw["ffn_down"],
                             lw.get("ffn_down_bias"), lw.get("attn_post_norm"), lw.get("ffn_post_norm"))
                       for i, lw in enumerate(w["layers"])]
        self.embd, self.out_norm, self.output = w["token_embd"], w["output_norm"], w["output"]
        self.embd_scale = cfg.embedding_scale  # Gemma's inp_scaled
        self.unit = self.k.geglu if gemma else self.k.swiglu  # the feed-forward's gated unit
        H, KVH, HD = self.heads
        f32, i32 = xp.float32, xp.int32
        self.token, self.pos = xp.zeros(1, i32), xp.zeros(1, i32)
        self.x, self.h = xp.zeros(cfg.n_embd, f32), xp.zeros(cfg.n_embd, f32)  # the residual, a norm's output
        self.qkv, self.q, self.attn = xp.zeros((H + 2 * KVH) * HD, f32), xp.zeros(H * HD, f32), xp.zeros(H * HD, f32)
        self.scores = xp.zeros((H, cache.n_ctx), f32)
        self.gu, self.act = xp.zeros(2 * cfg.n_ff, f32), xp.zeros(cfg.n_ff, f32)
        self.logits = xp.zeros((1, self.output.shape[0]), f32)
        self.graph = self.stream = None

    def run(self):
        """The step, kernel by kernel: pre_norm_block (or Gemma's sandwich_block) for each layer, then the final norm
        and the logits."""
        k, cfg, cache, eps = self.k, self.cfg, self.cache, self.cfg.rms_eps
        k.embed(self.token, self.embd, self.x)  # x [D]
        if self.embd_scale:
            k.scale(self.x, self.embd_scale)
        for i, L in enumerate(self.layers):
            k.rms_norm(self.x, L.attn_norm, eps, self.h)
            self.gemv(L.qkv, self.h, self.qkv, L.qkv_bias)  # [QKV]
            cos, sin = (cache.cos_swa, cache.sin_swa) if L.local and cfg.rope_base_swa else (cache.cos, cache.sin)
            k.rope_store(self.qkv, cos, sin, self.pos, self.q, cache.k[i], cache.v[i], L.q_norm, L.k_norm, eps,
                         self.heads, cfg.rope_layout)  # q [H*HD]; k, v into the cache
            k.attention(self.q, cache.k[i], cache.v[i], self.pos, self.scores, self.attn, cfg.kq_scale, self.heads,
                        cfg.sliding_window if L.local else None)  # [H*HD]
            self.residual(L.attn_output, self.attn, L.attn_output_bias, L.attn_post_norm)  # x += attn_out
            k.rms_norm(self.x, L.ffn_norm, eps, self.h)
            self.gemv(L.gate_up, self.h, self.gu, L.gate_up_bias)  # [2F]
            self.unit(self.gu[:cfg.n_ff], self.gu[cfg.n_ff:], self.act)  # [F]
            self.residual(L.ffn_down, self.act, L.ffn_down_bias, L.ffn_post_norm)  # x += ffn_out
        k.rms_norm(self.x, self.out_norm, eps, self.h)
        k.gemv(self.output, self.h, self.logits[0])
        if cfg.logit_softcap:
            k.softcap(self.logits[0], cfg.logit_softcap)

    def residual(self, w, x, bias, post_norm):  # the residual x += w . x (+ bias), or += post_norm(w . x): Gemma's
        if post_norm is None:
            self.k.gemv(w, x, self.x, bias=bias, res=self.x)
        else:
            self.k.gemv(w, x, self.h, bias=bias)  # [D]
            self.k.rms_norm(self.h, post_norm, self.cfg.rms_eps, self.x, res=self.x)

    def gemv(self, w, x, out, bias):  # a joined matrix's product, or its parts' each into its rows of out
        for m, a, b in w if isinstance(w, list) else [(w, 0, len(out))]:
            self.k.gemv(m, x, out[a:b], bias=None if bias is None else bias[a:b])

    def step(self, token, pos):  # -> [1, V] logits (a new array)
        if self.xp.__name__ != "cupy":
            self.token[0], self.pos[0] = token, pos
            self.run()
            return self.logits.copy()
        cupy = self.xp
        if self.stream is None:
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.stream.wait_event(cupy.cuda.get_current_stream().record())  # after the prefill's kernels
        with self.stream:
            self.token.fill(token)
            self.pos.fill(pos)
            if self.graph is None:
                self.capture()
            if self.graph:
                self.graph.launch(self.stream)
            else:
                self.run()
            logits = self.logits.copy()
        self.stream.synchronize()
        return logits

    def capture(self):
        """Record run() into a CUDA graph, after one run uncaptured (the kernels compiled, nothing left to allocate)
        that writes the K/V this step writes again. Where CUDA refuses the capture, the step runs its kernels one
        launch at a time, and says so once."""
        self.run()
        self.stream.begin_capture()
        try:
            self.run()
            self.graph = self.stream.end_capture()
        except Exception as e:  # a capture CUDA refused (an operation not allowed in one, a driver without graphs)
            if self.stream.is_capturing():
                self.stream.end_capture()
            self.graph = False
            print(f"refllama: decode runs without a CUDA graph: the capture failed ({e})", file=sys.stderr)
