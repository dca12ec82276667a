"""llama.cpp cross-built for an ARM CPU path (tools/build_llamacpp_arm.sh), run under qemu-aarch64: its logits for a
prompt, for the references of numerics ggml's NEON paths (make_tiny_gguf.py --ggml-logits --arm DIR,
make_llamacpp_exact.py --arm DIR)."""

import subprocess
import tempfile
from pathlib import Path

import numpy as np


def arm_logits(arm, model, ids, n_ctx, repack=True):
    """(llama.cpp's logits [T, V] for ids in one batch, its llama_print_system_info()) from the ARM build in
    `arm` (tools/llamacpp_logits.c: flash attention off, float16 cache, the repack on or off), under qemu-aarch64."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "logits.f32"
        cpu = (Path(arm) / "qemu-cpu").read_text().strip()
        info = subprocess.run(["qemu-aarch64", "-cpu", cpu, str(Path(arm) / "llamacpp_logits"), str(model),
                               str(n_ctx), ",".join(map(str, ids)), str(out)] + ([] if repack else ["--no-repack"]),
                              check=True, capture_output=True, text=True).stdout.strip()
        return np.fromfile(out, np.float32).reshape(len(ids), -1), info
