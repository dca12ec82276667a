"""Dump every stage of llama.cpp's forward pass over a prompt, in refllama's dump format (checkpoints/FORMAT.md).

llama.cpp's eval callback (`cb_eval`) sees each graph node after it is computed; this tool copies the
nodes it knows into numpy, names them as refllama does, and writes one dump directory:
  - one batch, every output row requested, flash attention off (so kq and kq_soft_max exist);
  - `embd` is stored as `inp_embd`; of the three nodes llama.cpp names `Qcur-N` (matmul, reshape, rope)
    the matmul becomes `Qcur-N` and the rope `Qcur_rope-N` (likewise `Kcur`); the reshape is skipped;
  - kq and kq_soft_max [S_pad, T, H] are cropped to the S = T cells this fresh context uses -> [H, T, S];
  - q/k stay in GGUF's interleaved pair layout (qk_layout "interleaved").
It also records llama.cpp's own greedy continuation (`--greedy N`) in the manifest, and with `--decode-steps N`
the stages of N decode steps after the prefill, one token each, as their own records.

    python tools/dump_llamacpp.py -p "The capital of France is" -o dumps/llamacpp-short
Needs llama-cpp-python (README: "Regenerating the references").
"""

import argparse
import ctypes
import os
import re
import sys

import llama_cpp
import numpy as np

from refllama import arch as archs
from refllama.api import default_model_path
from refllama.check.dump import ROUTED_STAGES, add_tool_args, file_sha256, plan_from_args, v_head_fields, write_dump
from refllama.formats.gguf_loader import GGUFFile
from refllama.numerics.cpu_paths import llamacpp_path

_GGML = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
_GGML.ggml_op_desc.restype = ctypes.c_char_p
_GGML.ggml_op_desc.argtypes = [ctypes.c_void_p]
_GGML.ggml_type_name.restype = ctypes.c_char_p
_GGML.ggml_type_name.argtypes = [ctypes.c_int]


class GGMLTensor(ctypes.Structure):
    """struct ggml_tensor (ggml.h, GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10, GGML_MAX_NAME 64)."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


# (llama.cpp node name prefix, op) -> refllama stage
# (a later node of one name, e.g. the bias ADD after the MUL_MAT, replaces the earlier)
STAGE_OF = {("embd", "GET_ROWS"): "inp_embd", ("inp_embd", "GET_ROWS"): "inp_embd",
            ("attn_norm", "MUL"): "attn_norm", ("Qcur", "MUL_MAT"): "Qcur", ("Kcur", "MUL_MAT"): "Kcur",
            ("Vcur", "MUL_MAT"): "Vcur", ("Qcur", "ADD"): "Qcur", ("Kcur", "ADD"): "Kcur", ("Vcur", "ADD"): "Vcur",
            ("wqkv", "MUL_MAT"): "wqkv", ("Qcur_normed", "MUL"): "Qcur_normed", ("Kcur_normed", "MUL"): "Kcur_normed",
            ("Qcur", "ROPE"): "Qcur_rope", ("Kcur", "ROPE"): "Kcur_rope",
            ("kq", "MUL_MAT"): "kq", ("kq_soft_max", "SOFT_MAX"): "kq_soft_max", ("kqv_out", "CONT"): "kqv_out",
            ("attn_out", "MUL_MAT"): "attn_out", ("ffn_inp", "ADD"): "ffn_inp", ("ffn_norm", "MUL"): "ffn_norm",
            ("ffn_gate", "MUL_MAT"): "ffn_gate", ("ffn_up", "MUL_MAT"): "ffn_up",
            ("ffn_swiglu", "SWIGLU"): "ffn_swiglu",
            ("ffn_out", "MUL_MAT"): "ffn_out", ("l_out", "ADD"): "l_out", ("result_norm", "MUL"): "result_norm",
            ("result_output", "MUL_MAT"): "result_output",
            # Gemma 3's graph
            ("inp_scaled", "SCALE"): "inp_scaled", ("attn_post_norm", "MUL"): "attn_post_norm",
            ("sa_out", "ADD"): "sa_out", ("ffn_geglu", "GEGLU"): "ffn_geglu", ("ffn_post_norm", "MUL"): "ffn_post_norm",
            ("result_output", "SCALE"): "result_output",  # logits soft-capped: scale, tanh, scale
            ("kq_scaled_2", "SCALE"): "kq_scaled_2",  # Gemma 2's scores soft-capped
            ("embd", "SCALE"): "inp_scaled",  # Granite's embeddings scaled (its GET_ROWS unnamed: TOKEN_EMBD)
            # GPT-2's: learned positions, LayerNorm (its bias ADD last), biases after each product
            ("pos_embd", "GET_ROWS"): "pos_embd", ("inpL", "ADD"): "inpL", ("attn_norm", "ADD"): "attn_norm",
            ("wqkv_b", "ADD"): "wqkv", ("ffn_norm", "ADD"): "ffn_norm", ("ffn_up_b", "ADD"): "ffn_up",
            ("ffn_gelu", "GELU"): "ffn_gelu", ("ffn_out", "ADD"): "ffn_out", ("result_norm", "ADD"): "result_norm",
            # build_moe_ffn's (qwen2moe's shared expert: build_ffn's ffn_gate/up/swiglu, then its own names)
            ("ffn_moe_logits", "MUL_MAT"): "ffn_moe_logits", ("ffn_moe_probs", "SOFT_MAX"): "ffn_moe_probs",
            ("ffn_moe_topk", "VIEW"): "ffn_moe_topk", ("ffn_moe_weights", "GET_ROWS"): "ffn_moe_weights",
            ("ffn_moe_weights_sum", "SUM_ROWS"): "ffn_moe_weights_sum",
            ("ffn_moe_weights_norm", "DIV"): "ffn_moe_weights_norm",
            ("ffn_moe_gate", "MUL_MAT_ID"): "ffn_moe_gate", ("ffn_moe_up", "MUL_MAT_ID"): "ffn_moe_up",
            ("ffn_moe_swiglu", "SWIGLU"): "ffn_moe_swiglu", ("ffn_moe_down", "MUL_MAT_ID"): "ffn_moe_down",
            ("ffn_moe_weighted", "MUL"): "ffn_moe_weighted", ("ffn_moe_out", "ADD"): "ffn_moe_out",
            ("ffn_moe_out", "CONT"): "ffn_moe_out", ("ffn_shexp_gate_inp", "MUL_MAT"): "ffn_shexp_gate_inp",
            ("ffn_shexp_gate", "DIV"): "ffn_shexp_gate", ("ffn_shexp", "MUL_MAT"): "ffn_shexp",
            ("ffn_shexp_out", "MUL"): "ffn_shexp_out",
            # gpt-oss's (openai-moe): the output projection's bias, the router's biased logits (named ffn_moe_probs:
            # its SOFTMAX_WEIGHT router takes them as they are), the K weights' softmax, the experts' biases
            ("attn_out", "ADD"): "attn_out", ("ffn_moe_probs", "ADD"): "ffn_moe_probs",
            ("ffn_moe_weights_softmax", "RESHAPE"): "ffn_moe_weights_softmax",
            ("ffn_moe_gate_biased", "ADD_ID"): "ffn_moe_gate_biased",
            ("ffn_moe_up_biased", "ADD_ID"): "ffn_moe_up_biased",
            ("ffn_moe_swiglu_oai", "SWIGLU_OAI"): "ffn_moe_swiglu_oai",
            ("ffn_moe_down_biased", "ADD_ID"): "ffn_moe_down_biased",
            # the hybrids' (qwen35's): linear attention (the v view is named after its repeat, skipped by the fused
            # delta rule), gated attention, the rows of result_norm picked (every row: all of them)
            ("model.input_embed", "GET_ROWS"): "inp_embd",
            ("linear_attn_qkv_mixed", "RESHAPE"): "linear_attn_qkv_mixed",
            ("z", "MUL_MAT"): "z", ("beta", "RESHAPE"): "beta", ("beta_sigmoid", "SIGMOID"): "beta_sigmoid",
            ("alpha", "RESHAPE"): "alpha", ("a_softplus", "SOFTPLUS"): "a_softplus", ("gate", "MUL"): "gate",
            ("conv_output_raw", "SSM_CONV"): "conv_output_raw", ("conv_output_silu", "SILU"): "conv_output_silu",
            ("q_conv", "VIEW"): "q_conv", ("k_conv", "VIEW"): "k_conv", ("v_conv_predelta", "VIEW"): "v_conv",
            ("q_conv_predelta", "SCALE"): "q_conv_predelta", ("k_conv_predelta", "SCALE"): "k_conv_predelta",
            ("attn_output", "VIEW"): "attn_output", ("final_output", "RESHAPE"): "final_output",
            ("linear_attn_out", "MUL_MAT"): "linear_attn_out", ("attn_residual", "ADD"): "ffn_inp",
            ("Qcur_full", "MUL_MAT"): "Qcur_full", ("attn_pregate", "CONT"): "attn_pregate",
            ("gate_sigmoid", "SIGMOID"): "gate_sigmoid", ("attn_gated", "MUL"): "attn_gated",
            ("result_norm", "GET_ROWS"): "result_norm", ("shared_expert_gate", "MUL_MAT"): "shared_expert_gate",
            ("shared_expert_gate_sigmoid", "SIGMOID"): "shared_expert_gate_sigmoid",
            ("ffn_shexp_gated", "MUL"): "ffn_shexp_gated",
            # qwen3next's: beta's and alpha's fused projection and its views, q and k repeated to the v heads
            ("model.embed_tokens", "GET_ROWS"): "inp_embd", ("linear_attn_mixed_ba", "MUL_MAT"): "linear_attn_mixed_ba",
            ("b", "VIEW"): "b", ("a", "VIEW"): "a", ("q_conv_predelta", "RESHAPE"): "q_conv_predelta",
            ("k_conv_predelta", "RESHAPE"): "k_conv_predelta",
            # DeepSeek-V3's routing (deepseek2's, glm4moe's graphs): sigmoid scores, the selection bias, the groups
            ("ffn_moe_probs", "SIGMOID"): "ffn_moe_probs", ("ffn_moe_probs_biased", "ADD"): "ffn_moe_probs_biased",
            ("ffn_moe_group_topk", "VIEW"): "ffn_moe_group_topk",
            ("ffn_moe_probs_masked", "RESHAPE"): "ffn_moe_probs_masked",
            ("ffn_moe_weights_scaled", "SCALE"): "ffn_moe_weights_scaled"}
HEADS_AXIS = {"q_conv", "k_conv", "v_conv", "q_conv_predelta", "k_conv_predelta", "attn_output",  # [1, T, n, d]
              "q_nope", "q_pe", "k_pe"}  # (deepseek2's views and ropes of q and of the latent's k_pe)
PER_HEAD = {"q_nope_absorbed", "kqv"}  # deepseek2's products per head [1, H, T, d] -> [T, H, d] (kqv: [T, H*d])
# the output projection is named "attn_out" in llama.cpp's llama graph only; elsewhere it is found by its weight,
# and the attention residual (named "ffn_inp" in most graphs, not in phi3's) as the ADD that takes it
UNNAMED = r"blk\.(\d+)\.attn_output\.weight"
TOKEN_EMBD = "token_embd.weight"  # an unnamed GET_ROWS of it: inp_embd
IN_BLOCK = {"ffn_post_norm"}  # stages that Gemma 2's and OLMo 2's graphs name without their layer (il = -1)
OUTPUT_BIAS = r"blk\.\d+\.attn_output\.bias"  # its bias, added by an unnamed ADD (GPT-2)
DTYPES = {"f32": np.float32, "f16": np.float16, "i32": np.int32}  # i32: the experts' ids


def to_numpy(t):
    """A copy of a host tensor, honouring its strides: numpy shape = reversed ggml ne."""
    dtype = np.dtype(DTYPES[_GGML.ggml_type_name(t.type).decode()])
    shape, strides = tuple(reversed(list(t.ne))), tuple(reversed(list(t.nb)))
    extent = sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + dtype.itemsize
    buf = (ctypes.c_char * extent).from_address(t.data)
    return np.lib.stride_tricks.as_strided(np.frombuffer(buf, dtype=dtype), shape, strides).astype(np.float32)


def arch_of(model_path):
    """The refllama.arch module of a GGUF file."""
    return archs.for_gguf(GGUFFile(model_path).string("general.architecture", required=True), model_path)


def unfuse(stages, arch, n_head, n_head_kv, kq_scale):
    """Stages under refllama's names where llama.cpp's graph for `arch` computes them fused or scaled: a fused
    node split by columns as the weights are split by rows (arch.LLAMACPP_FUSED), q/k/v shaped per head, and kq
    back to unscaled q.k where the graph scales q by `kq_scale` first (arch.LLAMACPP_Q_SCALED)."""
    heads = {"Qcur": n_head, "Kcur": n_head_kv, "Vcur": n_head_kv}
    for name in list(stages):
        stage, _, layer = name.rpartition("-")
        parts = getattr(arch, "LLAMACPP_FUSED", {}).get(stage)
        if parts:
            a = stages.pop(name)  # [T, sum of the parts' widths]
            shares = [heads.get(p, 1) for p in parts]  # q, k, v by head count; gate and up in halves
            cuts = np.cumsum(shares)[:-1] * (a.shape[1] // sum(shares))
            for part, x in zip(parts, np.split(a, cuts, axis=1), strict=True):
                stages[f"{part}-{layer}"] = x.reshape(len(x), heads[part], -1) if part in heads else x
        elif stage == "kq" and getattr(arch, "LLAMACPP_Q_SCALED", False):
            stages[name] = stages[name] / np.float32(kq_scale)
    return stages


def load_model(model_path, repack=True):
    """llama.cpp's model, its Q4_0/Q4_K matrices repacked for the CPU's interleaved kernels at load (its default)
    or not (`use_extra_bufts` off: llama-cli's --no-repack)."""
    mp = llama_cpp.llama_model_default_params()
    mp.use_extra_bufts = repack
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), mp)
    if not model:
        sys.exit(f"llama.cpp could not load {model_path}")
    return model


def new_context(model, n_ctx, n_batch, n_threads, kv_f32=False, cb=None):
    """A context with flash attention off (the unfused path exposes kq and kq_soft_max), a float16 KV cache
    (llama.cpp's default) or F32, and `cb` as its eval callback."""
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = n_ctx
    if kv_f32:
        cp.type_k = cp.type_v = 0  # GGML_TYPE_F32
    cp.n_batch = cp.n_ubatch = max(n_batch, 1)
    cp.n_threads = cp.n_threads_batch = n_threads
    cp.flash_attn_type = 0  # disabled
    if cb is not None:
        cp.cb_eval = cb
    return llama_cpp.llama_init_from_model(model, cp)


def decode(ctx, tokens, start, every_row=True):
    """Run `tokens` at positions start.. in one batch, every row's logits asked for (or the last row's, as
    llama-cli asks: its graph then cuts the rows before the last block's feed-forward); -> the last row's logits."""
    batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
    batch.n_tokens = len(tokens)
    for i, tok in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, start + i, 1
        batch.logits[i] = every_row or i == len(tokens) - 1
        batch.seq_id[i][0] = 0
    if llama_cpp.llama_decode(ctx, batch) != 0:
        sys.exit("llama_decode failed")
    llama_cpp.llama_batch_free(batch)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llama_cpp.llama_get_model(ctx)))
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()


def capture(model_path, ids, n_threads, kv_f32=False, n_ctx=None, decode_steps=0, repack=True):
    """Stages of one prefill of `ids`, then of each of `decode_steps` greedy decode steps (one token each), via
    cb_eval: (prefill stages, [each step's stages], the decoded ids). The KV cache is f16 (llama.cpp's default)
    or F32; `repack` as load_model."""
    model = load_model(model_path, repack)
    names = {**STAGE_OF, **getattr(arch_of(model_path), "LLAMACPP_NAMES", {})}
    heads = {"Qcur": llama_cpp.llama_model_n_head(model), "Kcur": llama_cpp.llama_model_n_head_kv(model),
             "Vcur": llama_cpp.llama_model_n_head_kv(model), "q": llama_cpp.llama_model_n_head(model)}
    step = {"stages": {}, "T": 0, "S": 0, "layer": ""}  # the batch being run: its stages, its tokens, the keys it
    # sees, the layer of the last node named with one
    attn_out = {}  # node address -> layer, to find the unnamed residual that adds it

    @llama_cpp.ggml_backend_sched_eval_callback
    def cb(ptr, ask, _):
        t = ctypes.cast(ptr, ctypes.POINTER(GGMLTensor)).contents
        name, op = t.name.decode(), _GGML.ggml_op_desc(ptr).decode()
        prefix, _, layer = name.rpartition("-") if "-" in name and name[-1].isdigit() else (name, "", "")
        stage = names.get((prefix, op))
        if stage is None and op == "MUL_MAT" and t.src[0]:  # a product left unnamed: known by its weight
            weight = re.fullmatch(UNNAMED, ctypes.cast(t.src[0], ctypes.POINTER(GGMLTensor)).contents.name.decode())
            stage, layer = ("attn_out", weight.group(1)) if weight else (None, "")
        if stage is None and op == "GET_ROWS" and t.src[0] and not step["layer"]:
            source = ctypes.cast(t.src[0], ctypes.POINTER(GGMLTensor)).contents.name.decode()
            stage = "inp_embd" if source == TOKEN_EMBD else None
        if stage in IN_BLOCK and not layer:
            layer = step["layer"]
        elif layer:
            step["layer"] = layer
        if stage is None and op == "ADD" and (t.src[0] in attn_out or t.src[1] in attn_out):
            bias = re.fullmatch(OUTPUT_BIAS, ctypes.cast(t.src[1], ctypes.POINTER(GGMLTensor)).contents.name.decode())
            stage = "attn_out" if bias else "ffn_inp"  # unnamed outside llama's graph
            layer = attn_out.get(t.src[0], attn_out.get(t.src[1]))
        if stage == "attn_out" or (op == "GET_ROWS" and t.src[0] in attn_out):  # the last block's rows picked
            attn_out[ptr] = layer if stage else attn_out[t.src[0]]
        if ask or stage is None:
            return stage is not None  # ask: observe only the nodes we store
        a, T = to_numpy(t), step["T"]  # [ne3, ne2, ne1, ne0]
        if stage in ("kq", "kq_scaled_2", "kq_soft_max"):
            a = a[0, :, :, :step["S"]]  # [H, T, S_pad] -> [H, T, S]: the cells this fresh context filled
        elif op == "CONCAT" or stage in HEADS_AXIS:  # deepseek2's Qcur and Kcur: a head's parts side by side
            a = a[0]  # [T, n, d]
        elif stage in PER_HEAD:
            a = a[0].transpose(1, 0, 2)
            a = a.reshape(T, -1) if stage == "kqv" else a
        elif stage in ("Qcur_rope", "Kcur_rope"):
            a = a[0]  # [T, n_heads, HD]
        elif stage in ("Qcur_normed", "Kcur_normed"):  # per head, or (OLMoE) over the whole projection
            a = a.reshape(T, heads[stage[:4]], -1)  # [T, n_heads, HD]
        elif stage in ROUTED_STAGES:
            a = a[0]  # [T, K, X]
        elif stage in heads:
            a = a[0, 0].reshape(T, heads[stage], -1)  # [T, n_heads * HD] -> [T, n_heads, HD]
        elif stage in ("beta", "beta_sigmoid", "b", "a"):  # [1, T, LV, 1] ([1, T, LK, LV/LK]: b, a)
            a = a.reshape(T, -1)
        elif stage.startswith("ffn_moe_weights"):
            a = a.reshape(T, -1)  # [T, K] ([T, 1]: the sum)
        else:
            a = a[0, 0]  # [T, width]
        step["stages"][f"{stage}-{layer}" if layer else stage] = a
        return True

    ctx = new_context(model, n_ctx or max(256, len(ids) + decode_steps + 64), len(ids), n_threads, kv_f32, cb)
    g = GGUFFile(model_path)
    arch = archs.for_gguf(g.string("general.architecture", required=True), model_path)
    kq_scale = arch.config_from_gguf(g).kq_scale if getattr(arch, "LLAMACPP_Q_SCALED", False) else None

    def run(tokens, start):
        step.update(stages={}, T=len(tokens), S=start + len(tokens), layer="")
        logits = decode(ctx, tokens, start)
        return unfuse(step["stages"], arch, heads["Qcur"], heads["Kcur"], kq_scale), int(np.argmax(logits))

    prefill, nxt = run(ids, 0)
    steps, decode_ids = [], []
    for k in range(decode_steps):
        decode_ids.append(nxt)
        stages, nxt = run([nxt], len(ids) + k)
        steps.append(stages)
    return prefill, steps, decode_ids, model, ctx, cb


def greedy(model_path, ids, n, n_threads, kv_f32=False, n_ctx=None, repack=True):
    """llama.cpp's own greedy continuation (argmax of its logits), n tokens; f16 (its default) or F32 KV cache."""
    if n <= 0:
        return []
    model = load_model(model_path, repack)
    ctx = new_context(model, n_ctx or len(ids) + n + 8, len(ids), n_threads, kv_f32)
    out = [int(np.argmax(decode(ctx, ids, 0, every_row=False)))]
    for k in range(n - 1):
        out.append(int(np.argmax(decode(ctx, out[-1:], len(ids) + k))))
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tool_args(p, "llama.cpp")
    p.add_argument("--no-repack", action="store_true",
                   help="load without the CPU repack (use_extra_bufts off, llama-cli's --no-repack): Q4_K by vec_dot")
    args = p.parse_args(argv)
    model_path = args.model or default_model_path()
    vocab = llama_cpp.Llama(model_path, vocab_only=True, verbose=False)
    ids = vocab.tokenize(args.prompt.encode("utf-8"), add_bos=True, special=args.special)
    repack = not args.no_repack
    stages, steps, decode_ids, *_ = capture(model_path, ids, args.threads, decode_steps=args.decode_steps,
                                            repack=repack)
    n_layer = 1 + max(int(n.rsplit("-", 1)[1]) for n in stages if n.startswith("l_out-"))
    arch = arch_of(model_path)
    stages_of = archs.layer_stages(arch, arch.config_from_gguf(GGUFFile(model_path)))
    names, rows, dtypes = plan_from_args(args, n_layer, len(ids), stages_of, arch.INPUTS)
    missing = [n for n in names if n not in stages]
    if missing:
        sys.exit(f"llama.cpp's graph had no node for: {', '.join(missing[:8])}")
    provenance = {
        "producer": f"llama.cpp via llama-cpp-python {llama_cpp.__version__} (cb_eval, CPU, flash_attn off"
                    f"{'' if repack else ', no repack'})",
        "repack": repack, "cpu_path": llamacpp_path(llama_cpp.llama_print_system_info().decode()),
        "model": os.path.basename(model_path), "model_sha256": file_sha256(model_path),
        "prompt": args.prompt, "parse_special": args.special, "token_ids": ids, "decode_ids": decode_ids,
        "arch": arch.NAME,
        "qk_layout": arch.ROPE_LAYOUT, **v_head_fields(arch.config_from_gguf(GGUFFile(model_path))),
        "greedy": greedy(model_path, ids, args.greedy, args.threads, repack=repack),
    }
    write_dump(args.out, {n: stages[n] for n in names}, provenance, rows, dtypes,
               [{n: step[n] for n in names} for step in steps])
    print(f"wrote {len(names)} stages for {len(ids)} tokens to {args.out}")


if __name__ == "__main__":
    main()
