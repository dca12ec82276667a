"""Write tests/data/gated_delta_net.npz: transformers' own Gated DeltaNet steps (Qwen3.5's modeling file: l2norm,
causal_conv1d_fn and causal_conv1d_update, torch_chunk_gated_delta_rule and torch_recurrent_gated_delta_rule,
Qwen3_5RMSNormGated) on random inputs, a prefill of T tokens then one decode step from its state, so that
tests/test_layers.py holds refllama.layers' forms to them (float32).

    python tools/make_gated_delta_refs.py   # seconds

Needs torch==2.13.0 and transformers 5 (README: "Regenerating the references").
"""

from pathlib import Path

import numpy as np
import torch
import transformers
from transformers.models.qwen3_5 import modeling_qwen3_5 as m

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "gated_delta_net.npz"
T, HK, HV, DK, DV, C, K = 7, 2, 4, 16, 8, 24, 4  # k heads != v heads (each k head serves 2 v heads, grouped)


def main():
    rng = np.random.default_rng(0)
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    a = {"q": f32(T + 1, HK, DK), "k": f32(T + 1, HK, DK), "v": f32(T + 1, HV, DV), "beta": rng.random((T + 1, HV),
         dtype=np.float32), "g": -rng.random((T + 1, HV), dtype=np.float32), "x": f32(T + 1, C), "w": f32(C, K),
         "norm_w": f32(DV), "z": f32(T + 1, HV, DV)}
    t = {n: torch.from_numpy(x) for n, x in a.items()}
    q, k = (m.l2norm(t[n], dim=-1, eps=1e-6) for n in ("q", "k"))
    out = {"l2_q": q.numpy()}
    rule = dict(initial_state=None, output_final_state=True, use_qk_l2norm_in_kernel=False)
    args = [x[None, :T] for x in (q, k, t["v"], t["g"], t["beta"])]  # a batch of one, the prefill
    o, s = m.torch_chunk_gated_delta_rule(*args, **rule)
    out["chunk_out"], out["chunk_state"] = o[0].numpy(), s[0].numpy()
    o, s = m.torch_recurrent_gated_delta_rule(*args, **rule)
    out["rec_out"], out["rec_state"] = o[0].numpy(), s[0].numpy()
    step = [x[None, T:] for x in (q, k, t["v"], t["g"], t["beta"])]
    o, s = m.torch_recurrent_gated_delta_rule(*step, initial_state=s, output_final_state=True)
    out["step_out"], out["step_state"] = o[0].numpy(), s[0].numpy()
    x = t["x"].T[None]  # [1, C, T+1]
    out["conv"] = m.causal_conv1d_fn(x[..., :T], t["w"], activation=None)[0].T.numpy()
    state = torch.nn.functional.pad(x[..., :T], (K - 1, 0))[..., -(K - 1):].clone()  # the last K - 1 inputs
    out["conv_step"] = m.causal_conv1d_update(x[..., T:], state, t["w"], activation=None)[0].T.numpy()
    norm = m.Qwen3_5RMSNormGated(DV, eps=1e-6)
    norm.weight.data = t["norm_w"]
    out["gated_norm"] = norm(t["v"][:T], t["z"][:T]).detach().numpy()
    np.savez(OUT, **a, **out, meta=np.array(f"transformers {transformers.__version__}, torch {torch.__version__}"))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
