"""Walk one token through a Gated DeltaNet layer of the tiny Qwen3.5 (tests/data/gguf-qwen35), printing each step's
real numbers and recomputing the delta rule by hand from the state the cache held: the numbers of
docs/linear-attention.md.

    python tools/walk_linear_attention.py   # a second
"""

import numpy as np

import refllama
from refllama.trace import trace

MODEL, PROMPT, LAYER, HEAD = "tests/data/gguf-qwen35/qwen35-f32.gguf", "The quick brown fox", 0, 1


def main():
    np.set_printoptions(precision=5, suppress=False, linewidth=110)
    m = refllama.load(MODEL, n_ctx=64)
    cfg, lw, L = m.config, m.weights["layers"][LAYER], LAYER
    ids = m.tokenize(PROMPT)
    m.forward(ids[:-1], 0)  # the prompt but its last token: the cache now holds the layer's state
    conv_state, state = m.cache.conv[L].copy(), m.cache.delta[L][HEAD].copy()
    with trace() as t:
        m.forward(ids[-1:], len(ids) - 1)  # the last token, a decode step
    s = {name.rsplit("-", 1)[0]: t[name][0] for name in t if name.endswith(f"-{L}")}
    k_head = HEAD % cfg.linear_k_heads  # tiled: v head h reads q/k head h % LK
    print(f"token {ids[-1]} at position {len(ids) - 1}; LK {cfg.linear_k_heads}, LV {cfg.linear_v_heads}, "
          f"LD {cfg.linear_head_dim}, CK {cfg.conv_kernel}; v head {HEAD} reads q/k head {k_head}")
    w = lw["ssm_conv1d"][0]
    print("conv, channel 0: state", conv_state[:, 0], "input", s["linear_attn_qkv_mixed"][0], "kernel", w)
    print("  conv_output_raw", s["conv_output_raw"][0], "= state . kernel[:3] + input kernel[3] =",
          np.float32(conv_state[:, 0] @ w[:3] + s["linear_attn_qkv_mixed"][0] * w[3]))
    q, k = s["q_conv"][k_head], s["k_conv"][k_head]
    qn, kn, v = s["q_conv_predelta"][k_head], s["k_conv_predelta"][k_head], s["v_conv"][HEAD]
    print(f"L2 norm: |q| {np.linalg.norm(q):.6f} -> {np.linalg.norm(qn):.6f}, |k| {np.linalg.norm(k):.6f} -> "
          f"{np.linalg.norm(kn):.6f} (eps {cfg.rms_eps:g} under the root)")
    print("beta = sigmoid", s["beta"][HEAD], "=", s["beta_sigmoid"][HEAD])
    print("g = ssm_a softplus(alpha + dt_bias):", lw["ssm_a"][HEAD], "x softplus(", s["alpha"][HEAD], "+",
          lw["ssm_dt"][HEAD], ") =", s["gate"][HEAD], "; decay exp(g) =", np.exp(s["gate"][HEAD]))
    g, beta = s["gate"][HEAD], s["beta_sigmoid"][HEAD]
    decayed = state * np.exp(g)
    recall = decayed @ kn
    delta = beta * (v - recall)
    after = decayed + np.outer(delta, kn)
    out = after @ qn / np.sqrt(cfg.linear_head_dim)
    cached = np.linalg.norm(m.cache.delta[L][HEAD])
    print(f"state [dv, dk] |S| {np.linalg.norm(state):.6g} -> decayed {np.linalg.norm(decayed):.6g} -> "
          f"written {np.linalg.norm(after):.6g} (the cache's after the step: {cached:.6g})")
    print("recall S k [:4]", recall[:4], " v [:4]", v[:4], " delta [:4]", delta[:4])
    print("out = S q / sqrt(LD) [:4]", out[:4], " the forward's attn_output", s["attn_output"][HEAD, :4])
    print("final_output = rms_norm(out) w silu(z) [:4]", s["final_output"].reshape(cfg.linear_v_heads, -1)[HEAD, :4])


if __name__ == "__main__":
    main()
