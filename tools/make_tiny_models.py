"""Write tests/data/tiny-{llama,mistral,qwen2,qwen3,phi3,gemma3,gpt2}/: tiny random models saved by transformers, with
transformers' logits and hidden states for a fixed token sequence (reference.npz) beside each.

Each exercises what its family changes from Llama: llama (Llama 3.1 RoPE scaling, tied embeddings, head_dim
set apart from hidden/heads, float32), mistral (sliding window shorter than the sequence, bfloat16),
qwen2 (q/k/v biases, float16), qwen3 (q/k norms, head_dim apart from hidden/heads, bfloat16), phi3 (fused qkv
and gate_up projections, LongRoPE short factors), gemma3 (Gemma3ForCausalLM: (1 + w) norms stored as w, local and
global layers with their own RoPE, a query_pre_attn_scalar apart from head_dim, soft-capped logits, bfloat16), gpt2
(GPT2LMHeadModel: Conv1D weights stored [in, out], learned positions, LayerNorm, an n_inner apart from 4 D, float16).
References are computed in float32 (from the stored weights) with eager attention.

    python tools/make_tiny_models.py [NAME ...]   # seconds; needs torch==2.13.0 and transformers (README)
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
)

T = 16
MODELS = {
    "llama": (LlamaConfig, torch.float32, dict(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        intermediate_size=96, vocab_size=128, max_position_embeddings=256, rms_norm_eps=1e-6,
        tie_word_embeddings=True, rope_theta=50000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 32})),
    "mistral": (MistralConfig, torch.bfloat16, dict(
        hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, intermediate_size=80,
        vocab_size=100, max_position_embeddings=128, sliding_window=5, rope_theta=10000.0, tie_word_embeddings=False)),
    "qwen2": (Qwen2Config, torch.float16, dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=120, max_position_embeddings=128, rope_theta=1000000.0, tie_word_embeddings=False)),
    "qwen3": (Qwen3Config, torch.bfloat16, dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        intermediate_size=96, vocab_size=120, max_position_embeddings=128, rope_theta=1000000.0,
        tie_word_embeddings=True)),
    "phi3": (Phi3Config, torch.float32, dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
        vocab_size=110, max_position_embeddings=256, original_max_position_embeddings=64, rope_theta=10000.0,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
        rope_scaling={"type": "longrope", "short_factor": [1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 4.0, 6.0],
                      "long_factor": [1.0, 1.5, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]})),
    "gemma3": (Gemma3TextConfig, torch.bfloat16, dict(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        intermediate_size=96, vocab_size=120, max_position_embeddings=128, rms_norm_eps=1e-6, sliding_window=5,
        sliding_window_pattern=2, query_pre_attn_scalar=48, final_logit_softcapping=5.0, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=2, eos_token_id=1,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0}})),
    "gpt2": (GPT2Config, torch.float16, dict(
        n_embd=48, n_layer=2, n_head=4, n_inner=80, n_positions=64, vocab_size=100, layer_norm_epsilon=1e-5,
        activation_function="gelu_new", bos_token_id=0, eos_token_id=0)),
}


def random_model(config, dtype=torch.float32):
    """A model of `config` with seeded random weights, norms and biases too (the init's are 1 and 0), so the
    checks see them."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(dtype).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or ".ln_" in n:  # GPT-2 calls its norms ln_1, ln_2, ln_f
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif n.endswith("bias"):
                p.copy_(0.5 * torch.randn_like(p))
    return model


def main(names=None):
    out = Path(__file__).resolve().parent.parent / "tests" / "data"
    for name in names or MODELS:
        config_class, dtype, kw = MODELS[name]
        config = config_class(**kw)
        model = random_model(config, dtype)
        d = out / f"tiny-{name}"
        shutil.rmtree(d, ignore_errors=True)
        model.save_pretrained(d)
        ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        ids = torch.from_numpy(np.random.default_rng(0).integers(3, config.vocab_size, T))[None]
        with torch.no_grad():
            r = ref(ids, output_hidden_states=True)
        np.savez(d / "reference.npz", token_ids=ids[0].numpy(), logits=r.logits[0].numpy(),
                 hidden_states=torch.stack(r.hidden_states)[:, 0].numpy())
        (d / "reference.json").write_text(json.dumps({
            "producer": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, eager attention",
            "tool": "tools/make_tiny_models.py", "stored_dtype": str(dtype),
            "hidden_states": "index 0: embeddings; i: output of block i-1; last: after the final norm"},
            indent=1) + "\n")
        print(f"wrote {d}")


if __name__ == "__main__":
    main(sys.argv[1:])
