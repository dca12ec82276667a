"""Dump every stage of transformers' forward pass over a prompt, in refllama's dump format (checkpoints/FORMAT.md).

transformers (torch CPU, float32) loads the same GGUF file and dequantizes it itself; forward hooks on
its modules give the stages, named as llama.cpp names them:
  embed_tokens -> inp_embd; input_layernorm -> attn_norm; q/k/v_proj (Phi-3: qkv_proj, split) -> Qcur/Kcur/Vcur;
  q_norm/k_norm (Qwen3) -> Qcur_normed/Kcur_normed; o_proj input and
  output -> kqv_out, attn_out; post_attention_layernorm input and output -> ffn_inp, ffn_norm; gate/up_proj
  (Phi-3: gate_up_proj, split) -> ffn_gate/ffn_up; down_proj input and output -> ffn_swiglu, ffn_out;
  decoder layer -> l_out;
  norm -> result_norm; the model's logits (after Gemma's soft-capping, as llama.cpp names them) -> result_output.
Gemma 3: embed_tokens' rows and its scaled output -> inp_embd, inp_scaled; post_attention_layernorm -> attn_post_norm;
  pre_feedforward_layernorm input and output -> sa_out, ffn_norm; down_proj input -> ffn_geglu;
  post_feedforward_layernorm -> ffn_post_norm (its q_norm/k_norm see q, k as [H, T, HD]: transposed back).
  Granite scales the embeddings outside the module: inp_scaled is its output times embedding_multiplier. Gemma 2's
  soft-capped scores -> kq_scaled_2.
OLMo 2 (no pre-norms): post_attention_layernorm -> attn_post_norm, the mlp's input -> ffn_inp,
  post_feedforward_layernorm -> ffn_post_norm.
GPT-2: wte, wpe and their sum (the dropout's output) -> inp_embd, pos_embd, inpL; ln_1 -> attn_norm; c_attn (split)
  -> Qcur/Kcur/Vcur; c_proj input and output -> kqv_out, attn_out; ln_2 input and output -> ffn_inp, ffn_norm;
  c_fc -> ffn_up; mlp.c_proj input and output -> ffn_gelu, ffn_out; ln_f -> result_norm.
Inside attention a registered attention function, transformers' eager attention written out, records the query and
key after RoPE (Qcur_rope, Kcur_rope), the unscaled scores query @ key^T (kq, which eager attention never keeps) and
the softmax weights (kq_soft_max).

transformers' GGUF loader undoes the q/k row permutation that llama.cpp's converter applied, so its q/k
are in the half-split pair layout: the manifest records qk_layout "half", and refllama's Dump reader
permutes each head's dims when comparing with an interleaved dump. Token ids come from refllama's
tokenizer (equal to llama.cpp's, see tests/test_tokenizer.py), so dumps of one prompt line up.

    python tools/dump_hf.py -p "The capital of France is" -o dumps/hf-short
Needs torch==2.13.0, transformers and accelerate (README: "Regenerating the references").
"""

import argparse
import os
import sys

import numpy as np

try:
    import torch
    import transformers
    from transformers import AttentionInterface, AutoModelForCausalLM, DynamicCache
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
except ImportError as e:
    sys.exit(f"tools/dump_hf.py: {e.name} is not installed here; pip install torch==2.13.0 transformers accelerate")
try:
    import refllama
except ImportError:  # a torch environment of its own: refllama's tokenizer and dump writer are needed beside it
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.exit(f"tools/dump_hf.py: refllama is not installed in this environment ({sys.executable}); install it "
             f"(torch untouched) with: {sys.executable} -m pip install -e {root}")
from refllama.api import default_model_path
from refllama.arch import layer_stages
from refllama.check.dump import add_tool_args, model_sha256, plan_from_args, write_dump

# transformers keeps HF's q/k pair layout (its GGUF loader undoes llama.cpp's permutation): "half" for every family
PRODUCER = {"producer": f"transformers {transformers.__version__} (torch {torch.__version__}, CPU, float32, eager)",
            "qk_layout": "half"}


def layouts(cfg):  # -> the manifest's layout fields for a model of refllama config `cfg`
    """q/k in HF's half-split pairs; linear attention's v heads in HF's grouped order, with the head counts the reader
    reorders them by."""
    grouped = {"v_head_order": "grouped", "linear_heads": [cfg.linear_k_heads, cfg.linear_v_heads]}
    return {**PRODUCER, **(grouped if cfg.linear_k_heads else {})}


def capture(hf, ids, decode_steps=0):
    """Stages of one forward pass of `ids` (batch of one), as numpy float32, then of `decode_steps` greedy decode
    steps, one token each through transformers' KV cache: (prefill stages, [each step's stages], decoded ids)."""
    stages, hooks = {}, []
    H = hf.config.num_attention_heads
    KVH = getattr(hf.config, "num_key_value_heads", None) or H

    def keep(name, t, heads=None, heads_first=False):
        a = t.detach().float().cpu().numpy()[0]  # drop the batch axis
        a = a.transpose(1, 0, 2) if heads_first else a  # [H, T, HD] -> [T, H, HD]
        stages[name] = a.reshape(a.shape[0], heads, -1) if heads else a

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        i = module.layer_idx
        keep(f"Qcur_rope-{i}", query.transpose(1, 2))  # [1, H, T, HD] -> [T, H, HD]
        keep(f"Kcur_rope-{i}", key[:, :, -query.shape[2]:].transpose(1, 2))  # this step's keys: [T, KVH, HD]
        k = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        v = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)
        scores = query @ k.transpose(2, 3)  # [1, H, T, S]
        keep(f"kq-{i}", scores)
        scores = scores * scaling
        if kwargs.get("softcap") is not None:  # Gemma 2: the scaled scores soft-capped
            scores = torch.tanh(scores / kwargs["softcap"]) * kwargs["softcap"]
            keep(f"kq_scaled_2-{i}", scores)
        if attention_mask is not None:
            scores = scores + attention_mask[:, :, :, :k.shape[-2]]
        if kwargs.get("s_aux") is not None:  # gpt-oss: a sink logit a head in the softmax, its weight then dropped
            sinks = kwargs["s_aux"].reshape(1, -1, 1, 1).expand(*scores.shape[:3], 1)
            weights = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1, dtype=torch.float32)[..., :-1]
        else:
            weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        keep(f"kq_soft_max-{i}", weights)  # [H, T, S]
        out = (weights @ v).transpose(1, 2).contiguous()  # [1, T, H, HD]
        if getattr(module, "q_proj", None) is not None and (  # (DeepSeek's: no head_dim, or no q_proj)
                module.q_proj.out_features == 2 * module.config.num_attention_heads * getattr(module, "head_dim", 0)):
            keep(f"attn_pregate-{i}", out.flatten(2))  # a hybrid's gated attention, before its gate
        return out, weights

    AttentionInterface.register("refllama_dump", attention)
    AttentionMaskInterface.register("refllama_dump", eager_mask)  # the causal mask eager attention gets
    hf.set_attn_implementation("refllama_dump")

    def out_hook(name, heads=None, heads_first=False):
        return lambda mod, inp, out: keep(name, out[0] if isinstance(out, tuple) else out, heads, heads_first)

    def in_hook(name):
        return lambda mod, inp: keep(name, inp[0])

    def split_hook(names, sizes):  # a fused projection's output, split as refllama splits its weight
        def hook(mod, inp, out):
            for name, part in zip(names, torch.split(out, sizes, dim=-1), strict=True):
                keep(name[0], part, name[1])
        return hook

    if hf.config.model_type == "gpt2":
        hooks += gpt2_hooks(hf.transformer, keep, out_hook, in_hook, split_hook, H)
    else:
        hooks += llama_hooks(hf, keep, out_hook, in_hook, split_hook, H, KVH)
    decode, decode_ids = [], []
    with torch.no_grad():  # a cache of every key on every layer (no config: no sliding-window layers that drop keys),
        # so that a decode step's scores span every position as refllama's do; the window is the mask's
        device = next(hf.parameters()).device  # the CPU here; a GPU in tools/gpu_check.py
        hybrid = "linear_attention" in (getattr(hf.config, "layer_types", None) or ())  # its layers' states: by config
        cache = DynamicCache(config=hf.config) if hybrid else DynamicCache()
        out = hf(torch.tensor([ids], device=device), past_key_values=cache, use_cache=True)
        keep("result_output", out.logits)
        prefill = dict(stages)
        for _ in range(decode_steps):
            decode_ids.append(int(out.logits[0, -1].argmax()))
            stages.clear()
            out = hf(torch.tensor([decode_ids[-1:]], device=device), past_key_values=out.past_key_values,
                     use_cache=True)
            keep("result_output", out.logits)
            decode.append(dict(stages))
    for h in hooks:
        h.remove()
    hf.set_attn_implementation("eager")
    return prefill, decode, decode_ids


def gpt2_hooks(m, keep, out_hook, in_hook, split_hook, H):
    D = m.config.n_embd
    hooks = [m.wte.register_forward_hook(out_hook("inp_embd")), m.wpe.register_forward_hook(out_hook("pos_embd")),
             m.drop.register_forward_hook(out_hook("inpL")), m.ln_f.register_forward_hook(out_hook("result_norm"))]
    for i, layer in enumerate(m.h):
        a, f = layer.attn, layer.mlp
        hooks += [layer.ln_1.register_forward_hook(out_hook(f"attn_norm-{i}")),
                  a.c_attn.register_forward_hook(split_hook([(f"Qcur-{i}", H), (f"Kcur-{i}", H), (f"Vcur-{i}", H)],
                                                            [D, D, D])),
                  a.c_proj.register_forward_pre_hook(in_hook(f"kqv_out-{i}")),
                  a.c_proj.register_forward_hook(out_hook(f"attn_out-{i}")),
                  layer.ln_2.register_forward_pre_hook(in_hook(f"ffn_inp-{i}")),
                  layer.ln_2.register_forward_hook(out_hook(f"ffn_norm-{i}")),
                  f.c_fc.register_forward_hook(out_hook(f"ffn_up-{i}")),
                  f.c_proj.register_forward_pre_hook(in_hook(f"ffn_gelu-{i}")),
                  f.c_proj.register_forward_hook(out_hook(f"ffn_out-{i}")),
                  layer.register_forward_hook(out_hook(f"l_out-{i}"))]
    return hooks


def llama_hooks(hf, keep, out_hook, in_hook, split_hook, H, KVH):
    hooks = []
    m = hf.model
    HD = hf.config.hidden_size // H if getattr(hf.config, "head_dim", None) is None else hf.config.head_dim
    gemma = hasattr(m.layers[0], "pre_feedforward_layernorm")
    post_norms_only = not hasattr(m.layers[0], "input_layernorm")  # OLMo 2
    multiplier = getattr(hf.config, "embedding_multiplier", None)  # Granite's, applied outside the module
    def embeddings(mod, inp, out):  # Gemma 2 and 3: the embedding module scales its rows by sqrt(D)
        keep("inp_embd", mod.weight[inp[0]])
        keep("inp_scaled", out)

    def scaled(mod, inp, out):  # Granite: the model scales the module's output
        keep("inp_embd", out)
        keep("inp_scaled", out * multiplier)

    if hasattr(m.embed_tokens, "embed_scale"):
        hooks.append(m.embed_tokens.register_forward_hook(embeddings))
    elif multiplier is not None:
        hooks.append(m.embed_tokens.register_forward_hook(scaled))
    else:
        hooks.append(m.embed_tokens.register_forward_hook(out_hook("inp_embd")))
    for i, layer in enumerate(m.layers):
        a, f = getattr(layer, "self_attn", None), layer.mlp
        if a is None:  # a hybrid's linear-attention layer (Qwen3.5's Gated DeltaNet)
            hooks += linear_attention_hooks(layer.linear_attn, i, keep, out_hook)
        elif hasattr(a, "kv_a_proj_with_mqa"):  # DeepSeek's latent attention, in the paper's (expanded) form
            hooks += latent_attention_hooks(a, i, keep, out_hook, H)
        elif a.q_proj.out_features == 2 * H * HD:  # a hybrid's gated attention: q and its gate, per head
            def gated(mod, inp, out, i=i):
                keep(f"Qcur_full-{i}", out)
                gate = out.view(*out.shape[:2], H, 2 * HD)[..., HD:]  # as its attention splits it
                keep(f"gate_sigmoid-{i}", torch.sigmoid(gate.reshape(*out.shape[:2], H * HD)))
            hooks += [a.q_proj.register_forward_hook(gated), a.k_proj.register_forward_hook(out_hook(f"Kcur-{i}", KVH)),
                      a.v_proj.register_forward_hook(out_hook(f"Vcur-{i}", KVH))]
        elif hasattr(a, "qkv_proj"):  # Phi-3: q, k, v fused
            hooks.append(a.qkv_proj.register_forward_hook(split_hook(
                [(f"Qcur-{i}", H), (f"Kcur-{i}", KVH), (f"Vcur-{i}", KVH)], [H * HD, KVH * HD, KVH * HD])))
        else:
            hooks += [a.q_proj.register_forward_hook(out_hook(f"Qcur-{i}", H)),
                      a.k_proj.register_forward_hook(out_hook(f"Kcur-{i}", KVH)),
                      a.v_proj.register_forward_hook(out_hook(f"Vcur-{i}", KVH))]
        if a is not None and hasattr(a, "q_norm"):  # Qwen3, Gemma 3: per-head norms of q and k
            hooks += [a.q_norm.register_forward_hook(out_hook(f"Qcur_normed-{i}", None if gemma else H, gemma)),
                      a.k_norm.register_forward_hook(out_hook(f"Kcur_normed-{i}", None if gemma else KVH, gemma))]
        if hasattr(f, "experts"):  # a mixture of experts
            hooks += moe_hooks(f, i, keep, out_hook, hybrid=hasattr(m.layers[0], "linear_attn"))
        elif hasattr(f, "gate_up_proj"):  # Phi-3: gate and up fused, gate first
            F = hf.config.intermediate_size
            hooks.append(f.gate_up_proj.register_forward_hook(split_hook([(f"ffn_gate-{i}", None),
                                                                          (f"ffn_up-{i}", None)], [F, F])))
        else:
            hooks += [f.gate_proj.register_forward_hook(out_hook(f"ffn_gate-{i}")),
                      f.up_proj.register_forward_hook(out_hook(f"ffn_up-{i}"))]
        hooks += [] if post_norms_only else [layer.input_layernorm.register_forward_hook(out_hook(f"attn_norm-{i}"))]
        if a is not None:  # the gated attention's o_proj reads the gated output
            gated = getattr(a, "q_proj", None) is not None and a.q_proj.out_features == 2 * H * HD
            hooks += [a.o_proj.register_forward_pre_hook(in_hook(f"{'attn_gated' if gated else 'kqv_out'}-{i}")),
                      a.o_proj.register_forward_hook(out_hook(f"attn_out-{i}"))]
        hooks.append(layer.register_forward_hook(out_hook(f"l_out-{i}")))
        if not hasattr(f, "experts"):
            hooks.append(f.down_proj.register_forward_hook(out_hook(f"ffn_out-{i}")))
        if gemma:
            hooks += [layer.post_attention_layernorm.register_forward_hook(out_hook(f"attn_post_norm-{i}")),
                      layer.pre_feedforward_layernorm.register_forward_pre_hook(in_hook(f"sa_out-{i}")),
                      layer.pre_feedforward_layernorm.register_forward_hook(out_hook(f"ffn_norm-{i}")),
                      f.down_proj.register_forward_pre_hook(in_hook(f"ffn_geglu-{i}")),
                      layer.post_feedforward_layernorm.register_forward_hook(out_hook(f"ffn_post_norm-{i}"))]
        elif post_norms_only:
            hooks += [layer.post_attention_layernorm.register_forward_hook(out_hook(f"attn_post_norm-{i}")),
                      f.register_forward_pre_hook(in_hook(f"ffn_inp-{i}")),
                      f.down_proj.register_forward_pre_hook(in_hook(f"ffn_swiglu-{i}")),
                      layer.post_feedforward_layernorm.register_forward_hook(out_hook(f"ffn_post_norm-{i}"))]
        else:
            hooks += [layer.post_attention_layernorm.register_forward_pre_hook(in_hook(f"ffn_inp-{i}")),
                      layer.post_attention_layernorm.register_forward_hook(out_hook(f"ffn_norm-{i}")),
                      *([] if hasattr(f, "experts") else [f.down_proj.register_forward_pre_hook(
                          in_hook(f"ffn_swiglu-{i}"))])]
    hooks.append(m.norm.register_forward_hook(out_hook("result_norm")))
    return hooks


def latent_attention_hooks(a, i, keep, out_hook, H):
    """DeepSeek's multi-head latent attention (transformers' expanded form): q (through q_a, its norm and q_b, or
    q_proj), the latent and k_pe's projection, the normed latent, its expansion into each head's k_nope and v (kv). Its
    rotated q_pe and k_pe are left out: transformers' interleaved RoPE writes each head's rotated pairs de-interleaved
    (evens, then odds); kq and kq_soft_max, which do not depend on that order, come from the attention function."""
    q, step = a.q_b_proj if a.q_proj is None else a.q_proj, {}

    def latent(mod, inp, out):
        step["T"] = out.shape[1]
        keep(f"kv_cmpr_pe-{i}", out)

    def kv(mod, inp, out):  # [1, 1, S, H * (NOPE + VD)]: every cached position's, this step's last
        keep(f"kv-{i}", out[:, 0, -step["T"]:], H)

    hooks = [q.register_forward_hook(out_hook(f"q-{i}", H)), a.kv_a_proj_with_mqa.register_forward_hook(latent),
             a.kv_a_layernorm.register_forward_hook(out_hook(f"kv_cmpr-{i}")), a.kv_b_proj.register_forward_hook(kv)]
    if a.q_proj is None:
        hooks.append(a.q_a_layernorm.register_forward_hook(out_hook(f"q_a_norm-{i}")))
    return hooks


def linear_attention_hooks(a, i, keep, out_hook):
    """A Gated DeltaNet layer's stages (Qwen3.5's modeling file), its v heads in HF's grouped order (the manifest's
    v_head_order): the projections by hooks; beta, the decay, the conv and the delta rule (functions, not modules)
    computed as its forward computes them from the projections, or recorded by wrapping the modeling module's
    functions while the layer runs."""
    m = sys.modules[type(a).__module__]  # the layer's modeling module (Qwen3.5's, Qwen3.5-MoE's, Qwen3-Next's)
    LK, LD = a.num_k_heads, a.head_k_dim
    functions, step = {}, {}

    def qkv(mod, inp, out):
        step["T"] = out.shape[1]
        keep(f"linear_attn_qkv_mixed-{i}", out)

    def qkvz(mod, inp, out):  # Qwen3-Next: q, k, v, z per q/k head, split as its forward splits them
        q, k, v, z, *_ = a.fix_query_key_value_ordering(out, torch.zeros(*out.shape[:2], 2 * a.num_v_heads))
        qkv(mod, inp, torch.cat([x.reshape(*out.shape[:2], -1) for x in (q, k, v)], dim=-1))
        keep(f"z-{i}", z.reshape(*out.shape[:2], -1))

    def ba(mod, inp, out):  # Qwen3-Next: b and a per q/k head
        keep(f"linear_attn_mixed_ba-{i}", out)
        r = a.num_v_heads // LK
        b, alpha = torch.split(out.view(*out.shape[:2], LK, 2 * r), [r, r], dim=-1)
        keep(f"b-{i}", b.reshape(*out.shape[:2], -1))
        keep(f"a-{i}", alpha.reshape(*out.shape[:2], -1))
        decay(alpha.reshape(*out.shape[:2], -1))

    def beta(mod, inp, out):
        keep(f"beta-{i}", out)
        keep(f"beta_sigmoid-{i}", out.sigmoid())

    def alpha(mod, inp, out):
        keep(f"alpha-{i}", out)
        decay(out)

    def decay(out):  # g = -exp(A_log) softplus(a + dt_bias), as its forward computes it
        soft = torch.nn.functional.softplus(out.float() + a.dt_bias)
        keep(f"a_softplus-{i}", soft)
        keep(f"gate-{i}", -a.A_log.float().exp() * soft)

    def conv_stages(raw, out):  # [1, C, T'] -> this step's T: a prefill's inputs may be padded, a decode's prefixed
        T = step["T"]
        raw, out = raw[..., -T:].transpose(1, 2), out[..., -T:].transpose(1, 2)  # [1, T, C]
        keep(f"conv_output_raw-{i}", raw)
        keep(f"conv_output_silu-{i}", out)
        q, k, v = torch.split(out, [LK * LD, LK * LD, a.num_v_heads * LD], dim=-1)
        for name, part in (("q_conv", q), ("k_conv", k), ("v_conv", v)):
            keep(f"{name}-{i}", part.reshape(1, T, -1, LD))

    def conv(fn):  # causal_conv1d_fn(x, weight, bias, activation): a pure function
        def wrapped(x, weight, bias=None, activation=None, **kwargs):
            out = fn(x, weight, bias, activation=activation, **kwargs)
            conv_stages(fn(x, weight, bias, activation=None, **kwargs), out)
            return out
        return wrapped

    def conv_update(fn):  # causal_conv1d_update(x, state, weight, bias, activation) updates the state in place
        def wrapped(x, state, weight, bias=None, activation=None):
            raw = fn(x, state.clone(), weight, bias, None)
            out = fn(x, state, weight, bias, activation)
            conv_stages(raw, out)
            return out
        return wrapped

    def rule(fn):
        def wrapped(query, key, *args, **kwargs):
            for name, x in (("q_conv_predelta", query), ("k_conv_predelta", key)):
                x = m.l2norm(x.float(), dim=-1, eps=1e-6)  # Qwen3-Next's files: repeated to the v heads (grouped)
                keep(f"{name}-{i}", x.repeat_interleave(a.num_v_heads // LK, dim=2) if hasattr(a, "in_proj_ba") else x)
            out, state = fn(query, key, *args, **kwargs)
            keep(f"attn_output-{i}", out)  # [1, T, LV, LD]
            return out, state
        return wrapped

    def enter(mod, inp):  # the module's functions wrapped while this layer runs
        for name, wrap in (("causal_conv1d_fn", conv), ("causal_conv1d_update", conv_update),
                           ("torch_chunk_gated_delta_rule", rule), ("torch_recurrent_gated_delta_rule", rule)):
            functions[name] = getattr(m, name)
            setattr(m, name, wrap(functions[name]))

    def leave(mod, inp, out):
        for name, fn in functions.items():
            setattr(m, name, fn)

    def final(mod, inp, out):  # the gated norm, over [T*LV, LD] rows
        keep(f"final_output-{i}", out.reshape(1, -1, a.num_v_heads * LD))

    hooks = [a.register_forward_pre_hook(enter), a.register_forward_hook(leave), a.norm.register_forward_hook(final),
             a.out_proj.register_forward_hook(out_hook(f"linear_attn_out-{i}"))]
    if hasattr(a, "in_proj_qkvz"):  # Qwen3-Next
        return hooks + [a.in_proj_qkvz.register_forward_hook(qkvz), a.in_proj_ba.register_forward_hook(ba)]
    return hooks + [a.in_proj_qkv.register_forward_hook(qkv), a.in_proj_z.register_forward_hook(out_hook(f"z-{i}")),
                    a.in_proj_b.register_forward_hook(beta), a.in_proj_a.register_forward_hook(alpha)]


def moe_hooks(f, i, keep, out_hook, hybrid=False):
    """A mixture of experts' stages that transformers exposes: the router's logits, its softmax, the chosen ids and
    weights (renormalised where the family says so; gpt-oss's softmaxed), the block's output; Qwen2-MoE's shared
    expert and its gate
    (`hybrid`: Qwen3.5-MoE's, under llama.cpp's qwen35moe names).
    The per-slot expert products stay inside transformers' fused experts module: not dumped. The block flattens its
    tokens ([T, ...], no batch axis) before the router and the shared expert."""
    def keep_rows(name, t):
        keep(name, t[None] if t.dim() == 2 else t)

    def rows_hook(name, before=False):
        if before:
            return lambda mod, inp: keep_rows(name, inp[0])
        return lambda mod, inp, out: keep_rows(name, out)

    def router(mod, inp, out):
        logits, weights, ids = out  # [T, E], [T, K], [T, K]
        probs = torch.softmax(logits.float(), dim=-1)
        keep_rows(f"ffn_moe_logits-{i}", logits)
        keep_rows(f"ffn_moe_probs-{i}", probs)
        keep_rows(f"ffn_moe_topk-{i}", ids.float())
        keep_rows(f"ffn_moe_weights-{i}", probs.gather(1, ids))
        keep_rows(f"ffn_moe_weights_sum-{i}", probs.gather(1, ids).sum(dim=1, keepdim=True))  # renormalising's divisor
        keep_rows(f"ffn_moe_weights_norm-{i}", weights)  # equal to ffn_moe_weights where not renormalised

    shexp = {}

    def shexp_gate(mod, inp, out):
        if hybrid:  # Qwen3.5-MoE: llama.cpp's qwen35moe names, the gated output too
            keep_rows(f"shared_expert_gate-{i}", out)
            keep_rows(f"shared_expert_gate_sigmoid-{i}", torch.sigmoid(out))
            keep_rows(f"ffn_shexp_gated-{i}", torch.sigmoid(out) * shexp["out"])
            return
        keep_rows(f"ffn_shexp_gate_inp-{i}", out)
        keep_rows(f"ffn_shexp_gate-{i}", torch.sigmoid(out))

    def shexp_out(mod, inp, out):
        shexp["out"] = out
        keep_rows(f"ffn_shexp-{i}", out)

    def oai_router(mod, inp, out):  # gpt-oss: its biased logits chosen from, the K of them softmaxed
        logits, weights, ids = out  # [T, E], [T, K], [T, K]
        keep_rows(f"ffn_moe_logits-{i}", logits - mod.bias)
        keep_rows(f"ffn_moe_probs-{i}", logits)
        keep_rows(f"ffn_moe_topk-{i}", ids.float())
        keep_rows(f"ffn_moe_weights-{i}", logits.gather(1, ids))
        keep_rows(f"ffn_moe_weights_softmax-{i}", weights)

    def sigmoid_router(mod, inp, out):  # DeepSeek-V3's, GLM-4.5's: each score chosen from with its bias, in groups
        logits, weights, ids = out  # [T, E], [T, K] (renormalised, scaled), [T, K]
        probs = torch.sigmoid(logits.float())
        chosen_by = probs + mod.e_score_correction_bias
        keep_rows(f"ffn_moe_logits-{i}", logits)
        keep_rows(f"ffn_moe_probs-{i}", probs)
        keep_rows(f"ffn_moe_probs_biased-{i}", chosen_by)
        if mod.num_group > 1:  # as its forward computes them: a group's two best summed, the best groups kept
            groups = chosen_by.view(len(chosen_by), mod.num_group, -1)
            best = groups.topk(2, dim=-1)[0].sum(dim=-1).topk(mod.topk_group, dim=-1)[1]  # sorted: best first
            keep_rows(f"ffn_moe_group_topk-{i}", best.float())
            mask = torch.zeros(groups.shape[:2], dtype=torch.bool).scatter_(1, best, True)
            keep_rows(f"ffn_moe_probs_masked-{i}", groups.masked_fill(~mask[..., None], float("-inf")).flatten(1))
        chosen = probs.gather(1, ids)
        keep_rows(f"ffn_moe_topk-{i}", ids.float())
        keep_rows(f"ffn_moe_weights-{i}", chosen)
        if mod.norm_topk_prob:
            keep_rows(f"ffn_moe_weights_sum-{i}", chosen.sum(dim=1, keepdim=True))
            keep_rows(f"ffn_moe_weights_norm-{i}", chosen / (chosen.sum(dim=-1, keepdim=True) + 1e-20))
        if mod.routed_scaling_factor != 1.0:
            keep_rows(f"ffn_moe_weights_scaled-{i}", weights)

    if hasattr(f, "router"):
        hooks = [f.router.register_forward_hook(oai_router)]
    elif hasattr(f.gate, "e_score_correction_bias"):
        hooks = [f.gate.register_forward_hook(sigmoid_router)]
    else:
        hooks = [f.gate.register_forward_hook(router)]
    if hasattr(f, "shared_experts"):  # DeepSeek's, GLM-4.5's: added ungated (ffn_out the sum)
        s = f.shared_experts
        return hooks + [s.gate_proj.register_forward_hook(rows_hook(f"ffn_gate-{i}")),
                        s.up_proj.register_forward_hook(rows_hook(f"ffn_up-{i}")),
                        s.down_proj.register_forward_pre_hook(rows_hook(f"ffn_swiglu-{i}", before=True)),
                        s.down_proj.register_forward_hook(rows_hook(f"ffn_shexp-{i}")),
                        f.experts.register_forward_hook(rows_hook(f"ffn_moe_out-{i}")),
                        f.register_forward_hook(out_hook(f"ffn_out-{i}"))]
    if hasattr(f, "shared_expert"):
        s = f.shared_expert
        hooks += [f.shared_expert_gate.register_forward_hook(shexp_gate),
                  s.gate_proj.register_forward_hook(rows_hook(f"ffn_gate-{i}")),
                  s.up_proj.register_forward_hook(rows_hook(f"ffn_up-{i}")),
                  s.down_proj.register_forward_pre_hook(rows_hook(f"ffn_swiglu-{i}", before=True)),
                  s.down_proj.register_forward_hook(shexp_out),
                  f.register_forward_hook(out_hook(f"ffn_out-{i}"))]
    else:
        hooks.append(f.register_forward_hook(out_hook(f"ffn_moe_out-{i}")))
    return hooks


def greedy(hf, ids, n):
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(hf(torch.tensor([seq]), use_cache=False).logits[0, -1].argmax()))
    return seq[len(ids):]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tool_args(p, "transformers")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_path = args.model or default_model_path()
    m = refllama.load(model_path)
    ids = m.tokenize(args.prompt, parse_special=args.special)
    d, f = os.path.split(os.path.abspath(model_path))
    load_args = dict(dtype=torch.float32, attn_implementation="eager")
    hf = (AutoModelForCausalLM.from_pretrained(model_path, **load_args) if os.path.isdir(model_path)
          else AutoModelForCausalLM.from_pretrained(d, gguf_file=f, **load_args)).eval()
    stages, decode, decode_ids = capture(hf, ids, args.decode_steps)
    names, rows, dtypes = plan_from_args(args, hf.config.num_hidden_layers, len(ids), layer_stages(m.arch, m.config),
                                         m.arch.INPUTS)
    provenance = {**layouts(m.config), "model": f, "model_sha256": model_sha256(model_path), "prompt": args.prompt,
                  "parse_special": args.special, "token_ids": ids, "decode_ids": decode_ids, "arch": m.config.arch,
                  "greedy": greedy(hf, ids, args.greedy)}
    kept = [n for n in names if n in stages]  # a mixture of experts' per-slot products stay inside transformers
    write_dump(args.out, {n: stages[n] for n in kept}, provenance, rows, dtypes,
               [{n: step[n] for n in kept if n in step} for step in decode])
    print(f"wrote {len(kept)} stages for {len(ids)} tokens to {args.out}")
    hidden = sorted({n.rsplit("-", 1)[0] for n in names if n not in stages})
    if hidden:
        print(f"not dumped (transformers computes them inside one module, checkpoints/FORMAT.md): {', '.join(hidden)}")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
