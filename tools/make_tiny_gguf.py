"""Write tests/data/gguf-{llama,qwen2,qwen3,phi3,gemma3,gpt2,mixtral,qwen3moe,qwen2moe,olmoe,gemma2,smollm3,olmo2,
granite,yarn,llama32,phi4,qwen35,qwen35moe,qwen3next,gptoss,deepseek3,moonlight,glm45}/: tiny random models made
by transformers, converted to GGUF by llama.cpp's own convert_hf_to_gguf.py (F32 and Q8_0), with both references
beside them:
  - transformers' logits and hidden states (float32, eager attention, from the HF weights);
  - llama.cpp's token ids for a text, its logits on both files, and a dump of every stage of every layer on the
    F32 file (llama-cpp-python, F32 KV cache, flash attention off: on F32 weights llama.cpp computes in float32).

The vocabulary is a tiny byte-level BPE trained here with `tokenizers` (320 tokens, Qwen2's pre-tokenizer). The
converter recognises a pre-tokenizer by hashing a real tokenizer's output, which a tiny one cannot reproduce, so
`get_vocab_base_pre` alone is answered ("qwen2"); everything else, tensors and metadata, is the converter's own.
Phi-3 takes the converter's GPT2Tokenizer path (Phi-4's) for the same vocabulary.

    python tools/make_tiny_gguf.py --llama-cpp /tmp/llama-cpp-python-0.3.36/vendor/llama.cpp   # ~1 minute
    python tools/make_tiny_gguf.py --llama-cpp ... gemma3      # one family
    PYTHONPATH=DIR python tools/make_tiny_gguf.py --ggml-logits   # llama.cpp's Q8_0 logits on another CPU path
    python tools/make_tiny_gguf.py --ggml-logits --arm OUT_DIR   # on an ARM path, under qemu-user (~10 s)
    python tools/make_tiny_gguf.py --ggml-stages   # llama.cpp's every stage on the 2025 families' Q8_0 files
    PYTHONPATH=DIR python tools/make_tiny_gguf.py --odd-blocks --llama-cpp ...   # gpt-oss 96 wide in MXFP4
    python tools/make_tiny_gguf.py --hf-mxfp4 --llama-cpp ...   # gpt-oss's HF directory with MXFP4-packed experts
Needs torch==2.13.0, transformers, llama-cpp-python 0.3.36 and the same version's sdist (README).

--ggml-logits adds to each family's reference.npz the logits on the Q8_0 file with llama.cpp's default float16 cache
(what numerics "ggml" reproduces to the bit) from the llama.cpp installed, under the key of the CPU path it computes
(REF_KEYS; `../shared/wheels/avx2/` installed into DIR with `pip install --target DIR --no-deps` for AVX2's), and
names the path in reference.json. With --arm, the llama.cpp is the one tools/build_llamacpp_arm.sh cross-built into
OUT_DIR, run under qemu-aarch64 on a CPU with that path's features.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import dump_hf
import dump_llamacpp
import make_tokenizer_table
import numpy as np
import torch
import transformers
from llamacpp_arm import arm_logits
from make_tiny_models import random_model
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    DeepseekV3Config,
    Gemma2Config,
    Gemma3TextConfig,
    Glm4MoeConfig,
    GPT2Config,
    GptOssConfig,
    GraniteConfig,
    LlamaConfig,
    MixtralConfig,
    Olmo2Config,
    OlmoeConfig,
    Phi3Config,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3Config,
    Qwen3MoeConfig,
    Qwen3NextConfig,
    SmolLM3Config,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from families import names  # tests/families.py: the catalogue of these fixtures

import refllama
from refllama.arch import get, layer_stages
from refllama.check.dump import file_sha256, storage_plan, v_head_fields, write_dump
from refllama.formats.pretokenizer import _QWEN2

OUT = Path(__file__).resolve().parent.parent / "tests" / "data"
V = 320
N_CTX = 256  # llama.cpp's context (it pads smaller ones to 256): Phi-3's original, so its short factors are taken
GREEDY = 16  # greedy tokens each reference records
N_CTX_LONG = 512  # beyond Phi-3's original context: llama.cpp takes its long factors
# the last three: llama.cpp's vocabulary loader looks them up in a Phi-3 model's vocabulary
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>", "<s>", "</s>"]
COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, vocab_size=V, max_position_embeddings=256, rms_norm_eps=1e-5,
              bos_token_id=None, eos_token_id=0, pad_token_id=0, tie_word_embeddings=False)
FAMILIES = {  # what each exercises: llama NORM pairs (permuted by the converter), tied output; qwen2 biases;
    # qwen3 q/k norms and head_dim != D/H; phi3 fused qkv and gate_up, LongRoPE with an attention factor
    "llama": (LlamaConfig, dict(COMMON, tie_word_embeddings=True, rope_theta=10000.0)),
    "qwen2": (Qwen2Config, dict(COMMON, rope_theta=1000000.0)),
    "qwen3": (Qwen3Config, dict(COMMON, head_dim=32, rope_theta=1000000.0)),
    "phi3": (Phi3Config, dict(COMMON, num_key_value_heads=4, max_position_embeddings=1024,
                              original_max_position_embeddings=N_CTX, rope_theta=10000.0,
                              rope_scaling={"type": "longrope",
                                            "short_factor": [1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0],
                                            "long_factor": [1.0, 1.5, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]})),
    # gemma3: 5 local layers (a window of 4 keys, RoPE base 10000) then a global one (base 1e6, linear scaling 2),
    # soft-capped logits; query_pre_attn_scalar = head_dim, the one llama.cpp's GGUF reading can express
    "gemma3": (Gemma3TextConfig, dict(COMMON, head_dim=32, num_hidden_layers=6, rms_norm_eps=1e-6,
                                      tie_word_embeddings=True, sliding_window=4, query_pre_attn_scalar=32,
                                      final_logit_softcapping=30.0, rope_parameters={
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                          "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                             "rope_theta": 1000000.0}})),
    # gpt2: learned positions, LayerNorm with biases, fused biased qkv, GELU MLP (the converter writes F = 4 D)
    # (n_ctx: GPT-2 configs on the Hub carry it, and the converter reads it)
    "gpt2": (GPT2Config, dict(n_embd=64, n_layer=2, n_head=4, n_positions=256, n_ctx=256, vocab_size=V,
                              layer_norm_epsilon=1e-5,
                              bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)),
    # mixtures of experts: mixtral (GGUF `llama` with experts, renormalised), qwen3moe (q/k norms, renormalised, 3 of
    # 8), qwen2moe (biases, not renormalised, a shared expert behind a gate), olmoe (q/k norms over the projection);
# experts 64 wide, a whole number of Q8_0 blocks
    "mixtral": (MixtralConfig, dict(COMMON, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
                                    rope_theta=10000.0)),
    "qwen3moe": (Qwen3MoeConfig, dict(COMMON, head_dim=32, moe_intermediate_size=64, num_experts=8,
                                      num_experts_per_tok=3, norm_topk_prob=True, rope_theta=1000000.0)),
    "qwen2moe": (Qwen2MoeConfig, dict(COMMON, moe_intermediate_size=64, shared_expert_intermediate_size=96,
                                      num_experts=6, num_experts_per_tok=2, rope_theta=1000000.0)),
    "olmoe": (OlmoeConfig, dict(COMMON, intermediate_size=64, num_experts=6, num_experts_per_tok=2,
                                num_key_value_heads=4, rope_theta=10000.0)),  # llama.cpp's olmoe: no GQA
    # the dense families of 2025-2026 (kept as HF directories too): gemma2 (local and global layers, both soft-caps
    # small enough to bend the tiny scores and logits), smollm3 (layer 3 NoPE), olmo2 (post-norms only, q/k norms over
    # the projection), granite (its four multipliers), yarn (Qwen3 with YaRN: 4x, from 64 positions), llama32 (Llama
    # 3.2: tied, llama3 RoPE scaling), phi4 (Phi-4-mini's shape: phi3 without LongRoPE, GQA, partial rotary)
    "gemma2": (Gemma2Config, dict(COMMON, head_dim=32, num_hidden_layers=4, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                  sliding_window=4, query_pre_attn_scalar=32, attn_logit_softcapping=0.5,
                                  final_logit_softcapping=1.0,
                                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "smollm3": (SmolLM3Config, dict(COMMON, num_hidden_layers=4, tie_word_embeddings=True,
                                    rope_parameters={"rope_type": "default", "rope_theta": 2000000.0})),
    "olmo2": (Olmo2Config, dict(COMMON, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    "granite": (GraniteConfig, dict(COMMON, embedding_multiplier=12.0, attention_multiplier=0.1,
                                    residual_multiplier=0.22, logits_scaling=8.0,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "yarn": (Qwen3Config, dict(COMMON, head_dim=32, rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 1000000.0})),
    "llama32": (LlamaConfig, dict(COMMON, tie_word_embeddings=True, rope_parameters={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64, "rope_theta": 500000.0})),
    "phi4": (Phi3Config, dict(COMMON, partial_rotary_factor=0.75, rope_theta=250000.0)),
    # the hybrids of 2026: qwen35 (Qwen3.5: three Gated DeltaNet layers, then gated full attention; 2 k heads for 4 v
    # heads, which its converter reorders to tiled; a quarter of each head rotated, in M-RoPE sections)
    "qwen35": (Qwen3_5TextConfig, dict(COMMON, head_dim=32, num_hidden_layers=4, rms_norm_eps=1e-6,
                                       linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                                       linear_num_value_heads=4, rope_parameters={
                                           "rope_type": "default", "rope_theta": 10000000.0,
                                           "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                                           "mrope_interleaved": True})),
    # qwen35moe (Qwen3.5-MoE: its experts renormalised, a shared expert behind a sigmoid gate; one k head a v head)
    "qwen35moe": (Qwen3_5MoeTextConfig, dict(COMMON, head_dim=32, num_hidden_layers=4, rms_norm_eps=1e-6,
                                             linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2,
                                             linear_num_value_heads=2, moe_intermediate_size=64,
                                             shared_expert_intermediate_size=96, num_experts=8, num_experts_per_tok=3,
                                             layer_types=["linear_attention", "full_attention", "linear_attention",
                                                          "full_attention"],
                                             rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                                              "partial_rotary_factor": 0.25,
                                                              "mrope_section": [4, 2, 2], "mrope_interleaved": True})),
    # qwen3next (Qwen3-Next: its v heads kept grouped, beta and alpha one projection, plain NEOX RoPE;
    # 3 k heads for 6 v heads)
    "qwen3next": (Qwen3NextConfig, dict(COMMON, head_dim=32, num_hidden_layers=4, rms_norm_eps=1e-6,
                                        linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=3,
                                        linear_num_value_heads=6, moe_intermediate_size=64,
                                        shared_expert_intermediate_size=96, num_experts=6, num_experts_per_tok=2,
                                        layer_types=["linear_attention", "linear_attention",
                                                                          "full_attention", "full_attention"],
                                        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                                         "partial_rotary_factor": 0.25})),
    # gpt-oss: biased attention with sinks, a window of 4 on alternate layers, YaRN (4x from 64 positions, truncated:
    # the one llama.cpp computes; reference.npz holds transformers' untruncated logits too), 3 of 6 biased experts
    # under the clamped SwiGLU (SCALE: some gates and ups past its limit)
    "gptoss": (GptOssConfig, dict(COMMON, head_dim=32, num_hidden_layers=4, intermediate_size=64, num_local_experts=6,
                                  num_experts_per_tok=3, sliding_window=4, rope_parameters={
                                      "rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                      "truncate": True, "original_max_position_embeddings": 64,
                                      "rope_theta": 150000.0})),
    # deepseek3 (DeepSeek-V3's architecture, GGUF deepseek2): multi-head latent attention (q through q_lora_rank, k/v
    # through kv_lora_rank and a shared rotary k_pe), YaRN with mscale_all_dim; a dense first layer, then 2 of 8 groups
    # of 8 experts chosen by sigmoid scores plus a selection bias, 3 experts, renormalised and scaled by 2.5, a
    # shared expert (scoring_func: the real checkpoints carry it, transformers' config does not write it)
    "deepseek3": (DeepseekV3Config, dict(
        COMMON, num_hidden_layers=3, rms_norm_eps=1e-6, num_key_value_heads=4, moe_intermediate_size=32,
        n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2, n_shared_experts=1, first_k_dense_replace=1,
        routed_scaling_factor=2.5, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16,
        v_head_dim=32, scoring_func="sigmoid", rope_parameters={
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mscale": 1.0,
            "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0, "rope_theta": 10000.0})),
    # moonlight (Moonlight-16B-A3B's kind: q in one projection, no q_lora_rank; no groups; no YaRN; 2 shared experts)
    "moonlight": (DeepseekV3Config, dict(
        COMMON, num_hidden_layers=3, rms_norm_eps=1e-6, num_key_value_heads=4, moe_intermediate_size=32,
        n_routed_experts=6, num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=2, first_k_dense_replace=1,
        routed_scaling_factor=2.446, q_lora_rank=None, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=32,
        v_head_dim=32, scoring_func="sigmoid", rope_parameters={"rope_type": "default", "rope_theta": 50000.0})),
    # glm45 (GLM-4.5): half of each head rotated (NEOX), q/k/v biases, q/k norms, a dense first layer, 2 of 8 experts
    # by sigmoid scores plus a selection bias, renormalised, scaled by 2.5, a shared expert
    "glm45": (Glm4MoeConfig, dict(
        COMMON, head_dim=32, num_hidden_layers=3, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5, attention_bias=True, use_qk_norm=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5})),
}
KEPT_HF = names(hf_model=True)  # the catalogue's: kept as HF directories too
Q8_0_STAGES = names(q8_0_stages=True)  # llama.cpp's every stage on the Q8_0 file (--ggml-stages)
ROUTER = (".gate.weight", ".shared_expert_gate.weight", ".router.weight")  # routers: transformers' init (std 0.02)
# nearly ties the experts' probabilities, so that the last bit of a logit would choose; 0.5 separates them
# a family's tensors by name ending: the std of their random values (gpt-oss's: so that the sinks take weight, some
# gates and ups pass the SwiGLU's limit of 7, and the tokens, not the biases, choose the experts)
SCALE = {"gptoss": {".sinks": 2.0, ".gate_up_proj": 1.0, ".down_proj": 0.05, ".down_proj_bias": 0.05,
                    ".o_proj.bias": 0.05, ".embed_tokens.weight": 1.0},
         # DeepSeek's and GLM's sigmoid routers: scores off their ends (0.5 saturates them, and the selection bias alone
         # would choose), the bias (SELECTION_BIAS) of their spread, embeddings that make the tokens choose
         **{name: {".gate.weight": 0.1, ".embed_tokens.weight": 1.0} for name in ("deepseek3", "moonlight", "glm45")}}
SELECTION_BIAS = 0.05  # the std of DeepSeek-V3's selection bias (e_score_correction_bias, a buffer: zero at init)
MXFP4 = ("gptoss",)  # also quantized by llama.cpp's own quantizer to MXFP4 (experts) and Q8_0 (the rest)
CORPUS = ("The capital of France is Paris. The quick brown fox jumps over the lazy dog. Numbers: 12 345 6789. "
          "Hello world! It's a small model, isn't it? Ça va très bien. ") * 4
TEXT = "The quick brown fox said: Paris is the capital, 2024! It's small."
CONVERT = """import sys
sys.path[:0] = [{src!r}]
sys.argv = ["convert_hf_to_gguf.py", {model!r}, "--outtype", {outtype!r}, "--outfile", {out!r}, *{extra!r}]
import convert_hf_to_gguf
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"  # a tiny vocabulary has no known hash
from conversion.gemma import Gemma2Model
Gemma2Model.set_vocab = TextModel._set_vocab_gpt2  # its converter reads only SentencePiece files: a BPE vocabulary
from conversion.glm import Glm4MoeModel
Glm4MoeModel.set_vocab = TextModel._set_vocab_gpt2  # its converter expects GLM's special tokens
from conversion.deepseek import DeepseekV2Model
_params = DeepseekV2Model.set_gguf_parameters
def _q_lora_rank_0(self):  # llama.cpp 0.3.36 requires q_lora_rank but in its 26- and 27-layer (V2-Lite) files
    _params(self)
    if self.hparams.get("q_lora_rank") is None:
        self.gguf_writer.add_q_lora_rank(0)
DeepseekV2Model.set_gguf_parameters = _q_lora_rank_0
convert_hf_to_gguf.main()
"""


# the hybrids: no multi-token-prediction head (their tiny models have none)
CONVERT_ARGS = {"qwen35": ("--no-mtp",), "qwen35moe": ("--no-mtp",), "qwen3next": ("--no-mtp",), "glm45": ("--no-mtp",)}


def quantize_mxfp4(f32, out):
    """llama.cpp's own quantizer (llama_model_quantize, LLAMA_FTYPE_MOSTLY_MXFP4_MOE): experts MXFP4, the other
    matrices Q8_0, vectors F32."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = 38  # LLAMA_FTYPE_MOSTLY_MXFP4_MOE
    if llama_cpp.llama_model_quantize(str(f32).encode(), str(out).encode(), ctypes.byref(params)) != 0:
        sys.exit(f"{out}: llama_model_quantize failed")


def untruncated_logits(model, ids):
    """transformers' logits of the same weights with YaRN's `truncate: false` (gpt-oss's released config), which
    llama.cpp cannot compute: the references' disagreement, kept to be shown."""
    config = model.config.__class__(**{**model.config.to_dict(), "rope_parameters": {
        **model.config.rope_parameters, "truncate": False}})
    other = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        return other(torch.tensor([ids])).logits[0].numpy()


def tiny_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_QWEN2), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=V, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS], trainer)
    assert tok.get_vocab_size() == V, tok.get_vocab_size()
    return tok


def save_hf(name, d, tok, **shape):
    """Family `name`'s tiny model, its config's fields replaced by `shape`, with the tokenizer, into directory d."""
    config_class, kw = FAMILIES[name]
    model = random_model(config_class(**{**kw, **shape}))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(ROUTER):
                p.copy_(0.5 * torch.randn_like(p))
            for suffix, std in SCALE.get(name, {}).items():
                if n.endswith(suffix):
                    p.copy_(std * torch.randn_like(p))
        for n, b in model.named_buffers():
            if n.endswith(".e_score_correction_bias"):  # the selection bias: a buffer, zero at init
                b.copy_(SELECTION_BIAS * torch.randn_like(b))
    model.save_pretrained(d)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer" if name in ("phi3", "phi4") else "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>", "add_bos_token": False,
        "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}))
    return model


REF_KEYS = {"avx512-vnni": "llamacpp_logits_q8_0_f16kv", "avx2": "llamacpp_logits_q8_0_f16kv_avx2",  # CPU path ->
            "neon-dotprod": "llamacpp_logits_q8_0_f16kv_neon_dotprod",  # the reference.npz key of llama.cpp's
            "neon-i8mm": "llamacpp_logits_q8_0_f16kv_neon_i8mm"}  # Q8_0 logits (float16 cache) on it


SHORT = (1, 5)  # ARM references also run the prompt's first 1 and 5 tokens alone (ARM's kernels for fewer than 8
# tokens, vec_dots and float16 sums in vectors of 4 x 8, differ from a batch's), and the first 1 and all of them with
# the repack off (Q8_0's vec_dot and tinyBLAS_Q0_ARM, which the repacked forms replace)


def ggml_logits(families, arm=None):
    """llama.cpp's Q8_0 logits (float16 cache) into each family's reference.npz, keyed by its path: the installed
    llama-cpp-python's, or (`arm`) an ARM build's under qemu-user."""
    from refllama.numerics.cpu_paths import llamacpp_path

    if arm is None:
        import llama_cpp

        info = llama_cpp.llama_print_system_info().decode().strip()
        producer = f"llama-cpp-python {llama_cpp.__version__}"
    for name in families:
        out = OUT / f"gguf-{name}"
        refs = dict(np.load(out / "reference.npz"))
        ids = refs["token_ids"].tolist()
        model = out / f"{name}-q8_0.gguf"
        short = {}
        if arm is None:
            logits = dump_llamacpp.capture(str(model), ids, 2, kv_f32=False, n_ctx=N_CTX)[0]["result_output"]
            if name in MXFP4:  # its MXFP4 file's logits, and greedy tokens, on this path too
                mx = str(out / f"{name}-mxfp4.gguf")
                short["mxfp4"] = dump_llamacpp.capture(mx, ids, 2, kv_f32=False, n_ctx=N_CTX)[0]["result_output"]
                short["mxfp4_greedy"] = np.asarray(dump_llamacpp.greedy(mx, ids, GREEDY, 2, n_ctx=N_CTX))
                short["mxfp4_norepack"] = dump_llamacpp.capture(mx, ids, 2, kv_f32=False, n_ctx=N_CTX,
                                                                repack=False)[0]["result_output"]  # its vec_dot
        else:
            logits, info = arm_logits(arm, model, ids, N_CTX)
            short = {f"first{n}": arm_logits(arm, model, ids[:n], N_CTX)[0] for n in SHORT}
            short.update({f"first{n}_norepack": arm_logits(arm, model, ids[:n], N_CTX, repack=False)[0]
                          for n in (1, len(ids))})
            producer = "llama.cpp of llama-cpp-python 0.3.36 cross-built for aarch64, under qemu-aarch64"
        path = llamacpp_path(info)
        if path not in REF_KEYS:
            sys.exit(f"that llama.cpp computes the {path} path; references are kept for {', '.join(REF_KEYS)}")
        refs[REF_KEYS[path]] = logits
        refs.update({f"{REF_KEYS[path]}_{part}": rows for part, rows in short.items()})
        np.savez(out / "reference.npz", **refs)
        meta = json.loads((out / "reference.json").read_text())
        meta["q8_0_f16kv_paths"] = {**meta.get("q8_0_f16kv_paths", {}), REF_KEYS[path]: f"{path}: {producer} ({info})"}
        (out / "reference.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"{out}: {REF_KEYS[path]}")


ODD = OUT / "gguf-gptoss" / "gptoss-d96-mxfp4.gguf"  # gpt-oss 96 wide: 3 MXFP4 blocks a row, the vec_dot's odd one
ODD_IDS = [1, 5, 9, 14, 22, 31, 40, 47, 3, 11]


def odd_blocks(llama_cpp_dir):
    """The tiny gpt-oss 96 wide (hidden and experts) in MXFP4, where llama.cpp's vec_dot (its --no-repack form) ends
    on an odd block, and its logits with the float16 cache, repacked and not, from the llama.cpp installed, into
    gptoss-d96.npz under the CPU path's key (the file is made first where it is missing: needs `llama_cpp_dir`)."""
    import llama_cpp

    from refllama.numerics.cpu_paths import llamacpp_path

    if not ODD.exists():
        with tempfile.TemporaryDirectory() as tmp:
            hf, f32 = Path(tmp) / "hf", Path(tmp) / "f32.gguf"
            save_hf("gptoss", hf, tiny_tokenizer(), hidden_size=96, intermediate_size=96)
            script = CONVERT.format(src=llama_cpp_dir, model=str(hf), outtype="f32", out=str(f32), extra=())
            subprocess.run([sys.executable, "-c", script], check=True, cwd=llama_cpp_dir)
            quantize_mxfp4(f32, ODD)
    path = llamacpp_path(llama_cpp.llama_print_system_info().decode())
    refs_file = ODD.with_name("gptoss-d96.npz")
    refs = dict(np.load(refs_file)) if refs_file.exists() else {"token_ids": np.asarray(ODD_IDS)}
    for repack in (True, False):
        key = REF_KEYS[path].replace("q8_0", "mxfp4") + ("" if repack else "_norepack")
        refs[key] = dump_llamacpp.capture(str(ODD), ODD_IDS, 2, kv_f32=False, n_ctx=N_CTX,
                                          repack=repack)[0]["result_output"]
    np.savez(refs_file, **refs)
    print(f"{refs_file}: {path}")


PACKED = OUT / "gguf-gptoss" / "hf-mxfp4"  # the tiny gpt-oss as the released checkpoints pack their experts


def hf_mxfp4(llama_cpp_dir):
    """The tiny gpt-oss's HF directory with its experts packed as the released checkpoints pack them (MXFP4 blocks
    and scales, quantization_config "mxfp4"; gguf-py's MXFP4 quantizer on the float experts, its blocks written in
    HF's nibble order), and llama.cpp's converter's F32 GGUF of it (its experts repacked to GGUF's MXFP4 by the
    converter): what refllama reads from the packed directory is held to the converter's bytes."""
    import gguf
    from safetensors.numpy import load_file, save_file

    src = OUT / "gguf-gptoss" / "hf-model"
    shutil.rmtree(PACKED, ignore_errors=True)
    shutil.copytree(src, PACKED)
    tensors = load_file(src / "model.safetensors")

    def pack(w):  # [E, N, K] float32 -> blocks [E, N, K/32, 16], scales [E, N, K/32] in HF's layout
        E, N, K = w.shape
        raw = gguf.quants.quantize(np.ascontiguousarray(w.reshape(E * N, K)), gguf.GGMLQuantizationType.MXFP4)
        raw = raw.reshape(E, N, K // 32, 17)
        qs = raw[..., 1:]
        values = np.concatenate([qs & 15, qs >> 4], axis=-1)  # GGUF's order: byte j holds values j and j + 16
        blocks = values[..., 0::2] | (values[..., 1::2] << 4)  # HF's: byte j holds values 2j and 2j + 1
        return np.ascontiguousarray(blocks.astype(np.uint8)), np.ascontiguousarray(raw[..., 0])

    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = pack(tensors.pop(name).transpose(0, 2, 1))  # HF's [E, in, out] -> [E, out, in]
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
    save_file(tensors, PACKED / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((PACKED / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4",
                                     "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                                "model.embed_tokens", "lm_head"]}
    (PACKED / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    out = OUT / "gguf-gptoss" / "gptoss-hf-mxfp4.gguf"
    script = CONVERT.format(src=llama_cpp_dir, model=str(PACKED), outtype="f32", out=str(out), extra=())
    subprocess.run([sys.executable, "-c", script], check=True, cwd=llama_cpp_dir)
    print(f"wrote {PACKED}, {out}")


def ggml_stages(families):
    """llama.cpp's every stage on the Q8_0 file with its default float16 cache (what numerics ggml reproduces to the
    bit, stage by stage) from the llama.cpp installed, into each family's llamacpp-q8_0/, naming its CPU path."""
    import llama_cpp

    from refllama.numerics.cpu_paths import llamacpp_path

    info = llama_cpp.llama_print_system_info().decode().strip()
    for name in families:
        out = OUT / f"gguf-{name}"
        model = out / f"{name}-q8_0.gguf"
        ids = np.load(out / "reference.npz")["token_ids"].tolist()
        stages = dump_llamacpp.capture(str(model), ids, 2, kv_f32=False, n_ctx=N_CTX)[0]
        cfg = refllama.load(model).config
        arch = get(cfg.arch)
        names, rows, dtypes = storage_plan(cfg.n_layer, len(ids), inputs=arch.INPUTS, stages=layer_stages(arch, cfg))
        write_dump(out / "llamacpp-q8_0", {n: stages[n] for n in names if n in stages}, {  # deepseek2: not kv
            "producer": f"llama.cpp via llama-cpp-python {llama_cpp.__version__} (cb_eval, CPU, flash_attn off, "
                        "float16 KV cache)", "repack": True, "cpu_path": llamacpp_path(info), "kv_cache": "float16",
            "qk_layout": arch.ROPE_LAYOUT, **v_head_fields(cfg), "model": model.name,
            "model_sha256": file_sha256(model), "prompt": TEXT, "token_ids": ids, "arch": arch.NAME})
        print(f"{out}: llamacpp-q8_0 ({llamacpp_path(info)})")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--llama-cpp", help="vendor/llama.cpp of the llama-cpp-python 0.3.36 sdist (to make the models)")
    p.add_argument("--ggml-logits", action="store_true", help="only llama.cpp's Q8_0 logits on its CPU path")
    p.add_argument("--arm", metavar="OUT_DIR", help="with --ggml-logits: the ARM build of tools/build_llamacpp_arm.sh")
    p.add_argument("--ggml-stages", action="store_true", help="only llama.cpp's every stage on the Q8_0 file")
    p.add_argument("--odd-blocks", action="store_true", help="only the 96-wide MXFP4 gpt-oss and its logits")
    p.add_argument("--hf-mxfp4", action="store_true", help="only the tiny gpt-oss packed as its released checkpoints")
    p.add_argument("families", nargs="*", choices=[[], *FAMILIES], help="the families to make (default: all)")
    args = p.parse_args()
    if args.ggml_logits:
        return ggml_logits(args.families or FAMILIES, args.arm)
    if args.ggml_stages:
        return ggml_stages(args.families or Q8_0_STAGES)
    if args.odd_blocks:
        return odd_blocks(args.llama_cpp)
    if args.hf_mxfp4:
        return hf_mxfp4(args.llama_cpp)
    if not args.llama_cpp:
        p.error("--llama-cpp is needed to make the models")
    import llama_cpp

    tok = tiny_tokenizer()
    for name in args.families or FAMILIES:
        out = OUT / f"gguf-{name}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        with tempfile.TemporaryDirectory() as tmp:
            hf_dir = Path(tmp) / name
            model = save_hf(name, hf_dir, tok)
            if name in KEPT_HF:  # kept: checked as HF directories too
                shutil.copytree(hf_dir, out / "hf-model")
            for outtype in ("f32", "q8_0"):
                script = CONVERT.format(src=args.llama_cpp, model=str(hf_dir), outtype=outtype,
                                        out=str(out / f"{name}-{outtype}.gguf"), extra=CONVERT_ARGS.get(name, ()))
                subprocess.run([sys.executable, "-c", script], check=True, cwd=args.llama_cpp)
        f32, q8 = out / f"{name}-f32.gguf", out / f"{name}-q8_0.gguf"
        if name in MXFP4:
            quantize_mxfp4(f32, out / f"{name}-mxfp4.gguf")
        vocab = llama_cpp.Llama(str(f32), vocab_only=True, verbose=False)
        ids = vocab.tokenize(TEXT.encode(), add_bos=True, special=False)
        with torch.no_grad():
            r = model(torch.tensor([ids]), output_hidden_states=True)
        stages, *_ = dump_llamacpp.capture(str(f32), ids, 2, kv_f32=True, n_ctx=N_CTX)
        def logits(path, n_ctx=N_CTX, kv_f32=True, ids=ids):
            return dump_llamacpp.capture(str(path), ids, 2, kv_f32=kv_f32, n_ctx=n_ctx)[0]["result_output"]

        long = {"llamacpp_logits_f32_long": logits(f32, N_CTX_LONG)} if name == "phi3" else {}
        if name in MXFP4:
            long["hf_logits_untruncated"] = untruncated_logits(model, ids)
        np.savez(out / "reference.npz", token_ids=np.asarray(ids), hf_logits=r.logits[0].numpy(),
                 hf_hidden_states=torch.stack(r.hidden_states)[:, 0].numpy(),
                 llamacpp_logits_f32=stages["result_output"], llamacpp_logits_q8_0=logits(q8),
                 llamacpp_logits_q8_0_f16kv=logits(q8, kv_f32=False), **long)  # llama.cpp's default cache
        cfg = refllama.load(f32).config
        arch = get(cfg.arch)  # mixtral: llama
        names, rows, dtypes = storage_plan(model.config.num_hidden_layers, len(ids), inputs=arch.INPUTS,
                                           stages=layer_stages(arch, cfg))
        common = {"model": f32.name, "model_sha256": file_sha256(f32), "prompt": TEXT, "token_ids": ids,
                  "arch": arch.NAME}
        write_dump(out / "llamacpp-f32", {n: stages[n] for n in names if n in stages}, {  # deepseek2: not kv
            "producer": f"llama.cpp via llama-cpp-python {llama_cpp.__version__} (cb_eval, CPU, flash_attn off, "
                        "F32 weights and KV cache)", "repack": True, "qk_layout": arch.ROPE_LAYOUT,
            **v_head_fields(cfg),
            "greedy": dump_llamacpp.greedy(str(f32), ids, GREEDY, 2, kv_f32=True, n_ctx=N_CTX), **common})
        theirs = dump_hf.capture(model, ids)[0]
        write_dump(out / "hf", {n: theirs[n] for n in names if n in theirs},  # experts' products: inside transformers
                   {**dump_hf.layouts(cfg), "greedy": dump_hf.greedy(model, ids, GREEDY), **common})
        (out / "reference.json").write_text(json.dumps({
            "text": TEXT, "tool": "tools/make_tiny_gguf.py", "llamacpp_eog": make_tokenizer_table.eog_ids(f32),
            "converter": "llama.cpp convert_hf_to_gguf.py (llama-cpp-python 0.3.36 sdist)",
            "transformers": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, eager",
            "llama.cpp": f"llama-cpp-python {llama_cpp.__version__}, F32 KV cache, flash attention off, CPU repack on "
                         "(its default; none of these matrices is one it repacks)"},
            indent=1) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
