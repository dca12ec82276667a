"""Weights tables: the row type every architecture's table is made of, the rows several families share (named once),
shapes in the legend's letters, and the reader that builds refllama's weight dict from a table."""

import ast
import itertools
from typing import NamedTuple

import numpy as np

from ..formats.ggml_types import GGMLType, QuantizedTensor
from ..pairs import permute_rows, tiled_order

GGUF_LAYER, HF_LAYER = "blk.{i}.", "model.layers.{i}."  # prefixes of a block's tensor names


class Weight(NamedTuple):
    """One row of an architecture's weights table."""

    key: str  # refllama's name: llama.cpp's tensor name without `blk.N.` and `.weight`
    shape: str  # numpy order, [out, in], in the legend's letters (D, H, KVH, HD, F, V, R; E, FE, FS for experts);
    # a leading E is the expert axis: read as a tuple of E matrices [out, in], each kept in its file form
    gguf: str | None  # GGUF tensor name (a block's: after `blk.N.`); None: not stored in GGUF files
    hf: str | None  # HF tensor name (a block's: after `model.layers.N.`, `{e}` an expert's number where HF stores
    # one tensor per expert); None: not stored in HF files
    required: bool = True
    hf_permute: str | None = None  # "H" or "KVH": HF's per-head q/k rows go to llama.cpp's NORM pairs at load
    split: tuple = ()  # a fused tensor: ((key, rows), ...), its parts in row order
    hf_add: float = 0.0  # added to the HF tensor at load (Gemma's norms: HF stores w for a (1 + w) weight)
    hf_transpose: bool = False  # HF stores it [in, out] (GPT-2's Conv1D): transposed at load
    hf_fused: tuple = ()  # (name, part, parts): experts HF may store as one [E, parts * N, K] tensor (transformers 5's
    # gate_up_proj: gate rows, then up rows), read where the per-expert tensors are absent
    hf_shape: str | None = None  # HF's shape where it has a unit axis more (a depthwise conv's [C, 1, CK])
    hf_tiled: tuple = ()  # (axis, start, unit): linear attention's v heads, `unit` wide from `start` on `axis`, from
    # HF's grouped order to llama.cpp's tiled one (pairs.tiled_order), as its Qwen3.5 converter reorders them
    hf_neg_exp: bool = False  # HF stores log(-w) (Gated DeltaNet's A_log): w = -exp(stored), as llama.cpp's converter
    product: bool = True  # a product's matrix (a placement may keep it in a matrix form); False: its values read
    # as an array (a conv's taps)
    hf_interleaved: bool = False  # hf_fused's parts alternate along HF's last axis (gpt-oss's gate_up_proj
    # [E, D, 2 FE]: gate in the even columns, up in the odd), a matrix stored [in, out] (transposed at load)
    hf_heads: tuple = ()  # (part, (size, ...)): HF's [H * sum(sizes), K] matrix holds each head's parts in turn
    # (DeepSeek's kv_b_proj: k_nope's rows, then v's); this row is part `part` of every head, [H, size, K]
    per_head: bool = False  # a leading H axis: one matrix a head, multiplied per head as one 3-D tensor (DeepSeek's
    # k_b, v_b), which llama.cpp never repacks
    gguf_transpose: bool = False  # GGUF stores each of its matrices [in, out] (DeepSeek's k_b): transposed at load
    hf_regroup: tuple = ()  # (groups, (part, ...)): HF's rows are `groups` runs of the parts side by side (Qwen3-Next's
    # q, k, v, z per q/k head): regrouped part by part (every group's first part, then second...) before `split`


# rows that several families share, named once; a family's own variant is `ROW._replace(...)`
TOKEN_EMBD = Weight("token_embd", "V, D", "token_embd.weight", "model.embed_tokens.weight")
OUTPUT_NORM = Weight("output_norm", "D", "output_norm.weight", "model.norm.weight")
OUTPUT = Weight("output", "V, D", "output.weight", "lm_head.weight", required=False)  # absent: tied to token_embd
ATTN_NORM = Weight("attn_norm", "D", "attn_norm.weight", "input_layernorm.weight")
ATTN_Q = Weight("attn_q", "H*HD, D", "attn_q.weight", "self_attn.q_proj.weight")
ATTN_K = Weight("attn_k", "KVH*HD, D", "attn_k.weight", "self_attn.k_proj.weight")
ATTN_V = Weight("attn_v", "KVH*HD, D", "attn_v.weight", "self_attn.v_proj.weight")
ATTN_Q_BIAS = Weight("attn_q_bias", "H*HD", "attn_q.bias", "self_attn.q_proj.bias")
ATTN_K_BIAS = Weight("attn_k_bias", "KVH*HD", "attn_k.bias", "self_attn.k_proj.bias")
ATTN_V_BIAS = Weight("attn_v_bias", "KVH*HD", "attn_v.bias", "self_attn.v_proj.bias")
ATTN_Q_NORM = Weight("attn_q_norm", "HD", "attn_q_norm.weight", "self_attn.q_norm.weight")
ATTN_K_NORM = Weight("attn_k_norm", "HD", "attn_k_norm.weight", "self_attn.k_norm.weight")
ATTN_OUTPUT = Weight("attn_output", "D, H*HD", "attn_output.weight", "self_attn.o_proj.weight")
ATTN_OUTPUT_BIAS = Weight("attn_output_bias", "D", "attn_output.bias", "self_attn.o_proj.bias")
FFN_NORM = Weight("ffn_norm", "D", "ffn_norm.weight", "post_attention_layernorm.weight")
FFN_GATE = Weight("ffn_gate", "F, D", "ffn_gate.weight", "mlp.gate_proj.weight")
FFN_UP = Weight("ffn_up", "F, D", "ffn_up.weight", "mlp.up_proj.weight")
FFN_DOWN = Weight("ffn_down", "D, F", "ffn_down.weight", "mlp.down_proj.weight")
# Gemma's four norms a block, each (1 + w): HF stores w
ATTN_POST_NORM = Weight("attn_post_norm", "D", "post_attention_norm.weight", "post_attention_layernorm.weight",
                        hf_add=1.0)
FFN_PRE_NORM = Weight("ffn_norm", "D", "ffn_norm.weight", "pre_feedforward_layernorm.weight", hf_add=1.0)
FFN_POST_NORM = Weight("ffn_post_norm", "D", "post_ffw_norm.weight", "post_feedforward_layernorm.weight", hf_add=1.0)
GEMMA_LAYER = (  # Gemma's block (2 and 3): four (1 + w) norms; Gemma 3 adds its q/k norms
    ATTN_NORM._replace(hf_add=1.0), ATTN_Q, ATTN_K, ATTN_V, ATTN_OUTPUT, ATTN_POST_NORM, FFN_PRE_NORM, FFN_GATE, FFN_UP,
    FFN_DOWN, FFN_POST_NORM)
LLAMA_LAYER = (  # a llama block's, HF's q/k rows permuted to NORM pairs as llama.cpp's LlamaModel converter does
    ATTN_NORM, ATTN_Q._replace(hf_permute="H"), ATTN_K._replace(hf_permute="KVH"), ATTN_V, ATTN_OUTPUT, FFN_NORM,
    FFN_GATE, FFN_UP, FFN_DOWN)
DENSE_FFN = ("ffn_gate", "ffn_up", "ffn_down", "ffn_gate_bias", "ffn_up_bias", "ffn_down_bias")  # a MoE layer lacks
MOE = (  # a mixture-of-experts feed-forward: the router and the experts' three matrices (Qwen2/3-MoE's, OLMoE's names)
    Weight("ffn_gate_inp", "E, D", "ffn_gate_inp.weight", "mlp.gate.weight"),
    Weight("ffn_gate_exps", "E, FE, D", "ffn_gate_exps.weight", "mlp.experts.{e}.gate_proj.weight",
           hf_fused=("mlp.experts.gate_up_proj", 0, 2)),
    Weight("ffn_up_exps", "E, FE, D", "ffn_up_exps.weight", "mlp.experts.{e}.up_proj.weight",
           hf_fused=("mlp.experts.gate_up_proj", 1, 2)),
    Weight("ffn_down_exps", "E, D, FE", "ffn_down_exps.weight", "mlp.experts.{e}.down_proj.weight",
           hf_fused=("mlp.experts.down_proj", 0, 1)),
)
SHARED_EXPERT = (  # Qwen2-MoE's shared expert and its gate
    Weight("ffn_gate_inp_shexp", "1, D", "ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight"),
    Weight("ffn_gate_shexp", "FS, D", "ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"),
    Weight("ffn_up_shexp", "FS, D", "ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"),
    Weight("ffn_down_shexp", "D, FS", "ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"),
)
DEEPSEEK_MOE = (  # DeepSeek-V3's and GLM-4.5's: the router with its selection bias, the experts, shared experts added
    # ungated (n_shared_experts of them as one feed-forward FS = n_shared * FE wide)
    *MOE, Weight("ffn_exp_probs_b", "E", "exp_probs_b.bias", "mlp.gate.e_score_correction_bias", required=False),
    *(row._replace(required=False) for row in (  # (a model without shared experts has none)
        Weight("ffn_gate_shexp", "FS, D", "ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"),
        Weight("ffn_up_shexp", "FS, D", "ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"),
        Weight("ffn_down_shexp", "D, FS", "ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"))),
)

# gpt-oss's: biased attention with a sink logit a head; a biased router whose softmax is over the K it chooses;
# biased experts, stored by HF as one gate_up tensor (interleaved columns) and one down tensor, each [E, in, out]
_GATE_UP, _DOWN = "mlp.experts.gate_up_proj", "mlp.experts.down_proj"
GPT_OSS_LAYER = (
    ATTN_NORM, ATTN_Q, ATTN_K, ATTN_V, ATTN_Q_BIAS, ATTN_K_BIAS, ATTN_V_BIAS, ATTN_OUTPUT, ATTN_OUTPUT_BIAS,
    Weight("attn_sinks", "H", "attn_sinks.weight", "self_attn.sinks"),
    Weight("ffn_norm", "D", "post_attention_norm.weight", "post_attention_layernorm.weight"))
GPT_OSS_MOE = (
    Weight("ffn_gate_inp", "E, D", "ffn_gate_inp.weight", "mlp.router.weight"),
    Weight("ffn_gate_inp_bias", "E", "ffn_gate_inp.bias", "mlp.router.bias"),
    Weight("ffn_gate_exps", "E, FE, D", "ffn_gate_exps.weight", _GATE_UP, hf_fused=(_GATE_UP, 0, 2),
           hf_interleaved=True),
    Weight("ffn_up_exps", "E, FE, D", "ffn_up_exps.weight", _GATE_UP, hf_fused=(_GATE_UP, 1, 2), hf_interleaved=True),
    Weight("ffn_down_exps", "E, D, FE", "ffn_down_exps.weight", _DOWN, hf_fused=(_DOWN, 0, 1), hf_interleaved=True),
    Weight("ffn_gate_exps_bias", "E, FE", "ffn_gate_exps.bias", _GATE_UP + "_bias", hf_fused=(_GATE_UP + "_bias", 0, 2),
           hf_interleaved=True, product=False),
    Weight("ffn_up_exps_bias", "E, FE", "ffn_up_exps.bias", _GATE_UP + "_bias", hf_fused=(_GATE_UP + "_bias", 1, 2),
           hf_interleaved=True, product=False),
    Weight("ffn_down_exps_bias", "E, D", "ffn_down_exps.bias", _DOWN + "_bias", hf_fused=(_DOWN + "_bias", 0, 1),
           hf_interleaved=True, product=False))

# the hybrids' (Qwen3.5, Qwen3.5-MoE, Qwen3-Next): their (1 + w) norms stored as w in HF
QWEN35_FFN_NORM = Weight("ffn_norm", "D", "post_attention_norm.weight", "post_attention_layernorm.weight", hf_add=1.0)
GATED_ATTENTION = (  # a full-attention layer's: q and its gate in one matrix, per head HD of q then HD of gate
    ATTN_NORM._replace(hf_add=1.0), ATTN_Q._replace(shape="2*H*HD, D"), ATTN_K, ATTN_V,
    ATTN_Q_NORM._replace(hf_add=1.0), ATTN_K_NORM._replace(hf_add=1.0), ATTN_OUTPUT)
_C = "2*LK*LD + LV*LD"  # linear attention's conv channels: q, k, v
GATED_DELTA_NET = (  # a linear-attention layer's; HF's v heads reordered to tiled (hf_tiled)
    ATTN_NORM._replace(hf_add=1.0),
    Weight("attn_qkv", f"{_C}, D", "attn_qkv.weight", "linear_attn.in_proj_qkv.weight", hf_tiled=(0, "2*LK*LD", "LD")),
    Weight("attn_gate", "LV*LD, D", "attn_gate.weight", "linear_attn.in_proj_z.weight", hf_tiled=(0, "0", "LD")),
    Weight("ssm_beta", "LV, D", "ssm_beta.weight", "linear_attn.in_proj_b.weight", hf_tiled=(0, "0", "1")),
    Weight("ssm_alpha", "LV, D", "ssm_alpha.weight", "linear_attn.in_proj_a.weight", hf_tiled=(0, "0", "1")),
    Weight("ssm_dt", "LV", "ssm_dt.bias", "linear_attn.dt_bias", hf_tiled=(0, "0", "1")),
    Weight("ssm_a", "LV", "ssm_a", "linear_attn.A_log", hf_tiled=(0, "0", "1"), hf_neg_exp=True),
    Weight("ssm_conv1d", f"{_C}, CK", "ssm_conv1d.weight", "linear_attn.conv1d.weight", hf_shape=f"{_C}, 1, CK",
           hf_tiled=(0, "2*LK*LD", "LD"), product=False),
    Weight("ssm_norm", "LD", "ssm_norm.weight", "linear_attn.norm.weight"),  # a plain weight in HF too
    Weight("ssm_out", "D, LV*LD", "ssm_out.weight", "linear_attn.out_proj.weight", hf_tiled=(1, "0", "LD")))
QWEN3NEXT_DELTA_NET = (  # Qwen3-Next's: its v heads grouped as HF's; q, k, v, z one HF matrix, beta and alpha one
    GATED_DELTA_NET[0], GATED_DELTA_NET[1]._replace(hf=None), GATED_DELTA_NET[2]._replace(hf=None),
    Weight("attn_qkvz", f"{_C} + LV*LD, D", None, "linear_attn.in_proj_qkvz.weight",
           hf_regroup=("LK", ("LD", "LD", "LV/LK*LD", "LV/LK*LD")), split=(("attn_qkv", _C), ("attn_gate", "LV*LD"))),
    Weight("ssm_ba", "2*LV, D", "ssm_ba.weight", "linear_attn.in_proj_ba.weight"),  # per q/k head: its v heads' b, a
    *(row._replace(hf_tiled=()) for row in GATED_DELTA_NET[5:]))


def dims(cfg):
    return {"D": cfg.n_embd, "H": cfg.n_head, "KVH": cfg.n_head_kv, "HD": cfg.head_dim, "F": cfg.n_ff,
            "V": cfg.vocab_size, "R": cfg.rope_dim, "P": cfg.n_ctx_train, "E": cfg.n_expert, "FE": cfg.n_ff_exp,
            "FS": cfg.n_ff_shexp, "LK": cfg.linear_k_heads, "LV": cfg.linear_v_heads, "LD": cfg.linear_head_dim,
            "CK": cfg.conv_kernel, "QL": cfg.q_lora_rank, "KL": cfg.kv_lora_rank,
            "NOPE": cfg.head_dim - cfg.rope_dim, "VD": cfg.v_head_dim}


def layer_rows(arch, cfg, i):
    """Block i's weights table: the family's LAYER_WEIGHTS (RECURRENT_WEIGHTS where layer i is linear attention),
    its dense feed-forward replaced by its MOE_WEIGHTS where layer i is a mixture of experts (a file may mix the two:
    Qwen2-MoE's mlp_only_layers)."""
    rows = arch.RECURRENT_WEIGHTS if cfg.is_recurrent(i) else arch.LAYER_WEIGHTS
    if not cfg.is_moe(i):
        return rows
    return tuple(row for row in rows if row.key not in DENSE_FFN) + arch.MOE_WEIGHTS


def experts(t, n):  # [E, N, K] array or QuantizedTensor -> E matrices [N, K], each still in its file form
    if isinstance(t, QuantizedTensor):
        return tuple(t.split([t.shape[1]] * n))
    return tuple(t)


def size(expr, d):
    """The value of a shape expression such as "H*HD + 2*KVH*HD" or "R/2" for the dims d."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Name):
            return d[node.id]
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult, ast.Div)):
            a, b = ev(node.left), ev(node.right)
            return a + b if isinstance(node.op, ast.Add) else a * b if isinstance(node.op, ast.Mult) else a // b
        raise ValueError(f"bad shape expression {expr!r}")
    return ev(ast.parse(expr.strip(), mode="eval"))


def shape_of(w, d):
    return tuple(size(e, d) for e in w.shape.split(","))


def stored_shape(row, shape, side, d):  # the shape a per-head row (hf_heads, gguf_transpose) is stored in
    H, N, K = shape
    if side == "gguf":
        return H, K, N
    part, sizes = row.hf_heads
    return H * sum(size(e, d) for e in sizes), N if row.hf_transpose else K


def per_head(row, shape, side, t, d):  # -> H float32 matrices [N, K]: a per-head row as the table's shape says
    """GGUF's transposed matrices transposed back; HF's heads' part `part` taken from each head's rows (and
    transposed where HF's is the other way round: DeepSeek's k_b, as llama.cpp's converter writes it)."""
    t = t.to_float32() if isinstance(t, QuantizedTensor) else np.asarray(t, dtype=np.float32)
    H = shape[0]
    if side == "gguf":
        return [np.ascontiguousarray(m.T) for m in t]
    part, sizes = row.hf_heads
    starts = np.cumsum([0, *(size(e, d) for e in sizes)])
    heads = t.reshape(H, starts[-1], -1)[:, starts[part]:starts[part + 1]]  # [H, size, K]
    return [np.ascontiguousarray(m.T if row.hf_transpose else m) for m in heads]


def mxfp4_from_hf(blocks, scales):  # [N, K/32, 16], [N, K/32] uint8 (HF's MXFP4) -> QuantizedTensor MXFP4 [N, K]
    """HF's packing (transformers' and OpenAI's: byte j of a block holds values 2j, low nibble, and 2j + 1) as GGUF's
    MXFP4 blocks (the exponent byte, then byte j holding values j and j + 16), as llama.cpp's converter repacks them:
    the same codes and exponents, in GGUF's order."""
    N, nb = scales.shape
    values = np.stack([blocks & 15, blocks >> 4], axis=-1).reshape(N, nb, 32)  # in order
    qs = values[..., :16] | (values[..., 16:] << 4)
    raw = np.concatenate([scales[..., None], qs], axis=-1).astype(np.uint8).reshape(N, nb * 17)
    return QuantizedTensor(raw, GGMLType.MXFP4, (N, nb * 32))


def read_weights(arch, cfg, side, fetch, has, place, packed=None):
    """refllama's weight dict from an architecture's tables: `side` "gguf" or "hf" picks the name column,
    `fetch(name, shape)` returns a checked tensor (or raises naming it), `has(name)` says whether it is stored,
    `place(tensor)` puts each final tensor where the backend computes (refllama.xp.Placement; `place.array` those
    no product reads), `packed(name, shape)` returns a quantizer's bytes (HF's MXFP4 experts) as stored.

    Layout transforms, all of them: HF's per-head q/k rows (and biases) reordered to llama.cpp's NORM pairs where
    the table says `hf_permute` (llama only: llama.cpp's converter does the same); fused tensors split by rows."""
    d = dims(cfg)

    def take(row, prefix, out):
        name = getattr(row, side)
        required = row.required or row.key == "output"  # read only when untied: then the model needs it
        if name is None or (not required and not has(prefix + name.format(e=0))
                            and not (row.hf_fused and has(prefix + row.hf_fused[0]))):
            return
        shape = shape_of(row, d)
        if side == "hf" and row.hf_interleaved:  # part `part` of every n_parts columns; a matrix [in, out] as stored
            fused, part, n_parts = row.hf_fused
            if len(shape) == 3 and has(prefix + fused + "_blocks"):  # the released checkpoints: MXFP4 blocks, [out,
                E, N, K = shape  # in] already, the parts' rows interleaved
                blocks = packed(prefix + fused + "_blocks", (E, n_parts * N, K // 32, 16))
                scales = packed(prefix + fused + "_scales", (E, n_parts * N, K // 32))
                out[row.key] = tuple(place(mxfp4_from_hf(blocks[e, part::n_parts], scales[e, part::n_parts]))
                                     for e in range(E))
                return
            whole = fetch(prefix + fused, (shape[0], shape[2], n_parts * shape[1]) if len(shape) == 3 else
                          (*shape[:-1], n_parts * shape[-1]))
            t = (whole.to_float32() if isinstance(whole, QuantizedTensor) else whole)[..., part::n_parts]
            t = np.ascontiguousarray(t.swapaxes(1, 2) if len(shape) == 3 else t)
            out[row.key] = tuple(map(place, t)) if len(shape) == 3 else place.array(t)
            return
        if len(shape) == 3 and (row.hf_heads if side == "hf" else row.gguf_transpose):  # a matrix per head, moved
            out[row.key] = tuple(map(place, per_head(row, shape, side, fetch(prefix + name, stored_shape(
                row, shape, side, d)), d)))
            return
        if len(shape) == 3:  # experts: one tensor (GGUF, transformers 5's fused form), or one per expert (HF)
            E, N, K = shape
            if "{e}" in name and (has(prefix + name.format(e=0)) or not row.hf_fused):
                parts = [fetch(prefix + name.format(e=e), (N, K)) for e in range(E)]
            elif "{e}" in name:  # fused: expert e's rows part * N .. (part + 1) * N of its [parts * N, K]
                fused, part, n_parts = row.hf_fused
                parts = [whole[part * N:(part + 1) * N] if not isinstance(whole, QuantizedTensor) else
                         whole.split([N] * n_parts)[part]
                         for whole in experts(fetch(prefix + fused, (E, n_parts * N, K)), E)]
            else:
                parts = experts(fetch(prefix + name, shape), E)
            out[row.key] = tuple(map(place.unrepacked if row.per_head else place, parts))
            return
        if side == "hf" and row.hf_shape:
            t = fetch(prefix + name, shape_of(row._replace(shape=row.hf_shape), d)).reshape(shape)
        else:
            t = fetch(prefix + name, shape[::-1] if side == "hf" and row.hf_transpose else shape)
        if isinstance(t, QuantizedTensor) and side == "hf" and (row.hf_transpose or row.hf_add or row.hf_neg_exp
                                                                or row.hf_tiled[:1] == (1,)):
            t = t.to_float32()  # kept as stored only where its rows alone move
        if side == "hf" and row.hf_transpose:
            t = np.ascontiguousarray(t.T)
        if side == "hf" and row.hf_permute:  # a matrix kept as stored has its bytes' rows reordered
            t = (t._replace(raw=permute_rows(t.raw, d[row.hf_permute], cfg.rope_dim, "interleaved"))
                 if isinstance(t, QuantizedTensor) else permute_rows(t, d[row.hf_permute], cfg.rope_dim, "interleaved"))
        if side == "hf" and row.hf_add:
            t = t + np.float32(row.hf_add)
        if side == "hf" and row.hf_neg_exp:
            t = -np.exp(t)
        if side == "hf" and row.hf_regroup:
            groups, parts = size(row.hf_regroup[0], d), [size(p, d) for p in row.hf_regroup[1]]
            runs = np.arange(t.shape[0]).reshape(groups, sum(parts))
            order = np.concatenate([runs[:, a:b].reshape(-1) for a, b in itertools.pairwise([0, *np.cumsum(parts)])])
            t = t._replace(raw=t.raw[order]) if isinstance(t, QuantizedTensor) else t[order]
        if side == "hf" and row.hf_tiled:
            axis, start, unit = row.hf_tiled
            args = (size(start, d), size(unit, d), cfg.linear_k_heads, cfg.linear_v_heads)
            order = tiled_order(t.shape[axis], *args)
            t = t._replace(raw=t.raw[order]) if isinstance(t, QuantizedTensor) else np.take(t, order, axis=axis)
        if row.split:
            sizes = [size(e, d) for _, e in row.split]
            parts = t.split(sizes) if isinstance(t, QuantizedTensor) else np.split(t, np.cumsum(sizes)[:-1])
            out.update(zip((key for key, _ in row.split), map(place, parts), strict=True))
        else:
            out[row.key] = place(t) if row.product else place.array(t)

    w = {}
    for row in arch.WEIGHTS:
        if not (row.key == "output" and cfg.tied_output):
            take(row, "", w)
    if cfg.tied_output:
        w["output"] = w["token_embd"]
    w["layers"] = []
    for i in range(cfg.n_layer):
        lw = {}
        for row in layer_rows(arch, cfg, i):
            take(row, (GGUF_LAYER if side == "gguf" else getattr(arch, "HF_LAYER", HF_LAYER)).format(i=i), lw)
        if hasattr(place, "layer"):  # a backend that joins a layer's matrices (refllama.numerics.matrices.fuse_layer)
            place.layer(lw)
        w["layers"].append(lw)
    return w
