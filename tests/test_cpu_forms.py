"""The Numba kernels as an AVX2-only host compiles them (Numba told NUMBA_CPU_NAME=haswell and its features, in a
process of its own), on this host: the integer kernels' AVX2 form (vpmaddubsw, vpmaddwd) and the small steps of the
AVX2 path give numerics ggml's NumPy emulation to the bit, and numerics float32's products (fewer rows at once, to
fit 16 registers of 8 lanes) the same bits as this host's own form."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from refllama.numerics import ggml_blocks as gb

AVX2_HOST = {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "+avx2,+fma,+f16c"}

PROBE = """
import json, sys
import numpy as np
from refllama.formats.ggml_types import GGMLType as QT
from refllama.numerics import ggml_blocks as gb, ggml_kernels as gk, ggml_kquants as gq, ggml_numerics as gn, quant
sys.path.insert(0, "tests")
from test_cpu_forms import cases
out = {"isa": gb.ISA, "rows": quant.ROWS, "side": quant.SIDE, "krows": gq.ROWS, "float32": {}, "ggml": {}}
for name, (raw, qtype, x) in cases().items():
    out["float32"][name] = (x @ quant.QuantMatrix([raw], qtype, x.shape[1]).T).tolist()
    fast = (gq.NumbaKQuantMatrix if qtype in gq.K_QUANTS else gb.NumbaGgmlMatrix)([raw], qtype, x.shape[1])
    want = gn.GgmlMatrix(raw, qtype, (len(raw), x.shape[1]))
    fast.repacked = want.repacked = gn.repacked(qtype, want.shape, "avx2")
    out["ggml"][name] = bool(np.array_equal(x @ fast.T, x @ want.T))
q = np.random.default_rng(1).standard_normal((3, 4, 64)).astype(np.float32)
kv = gn.round_f16(np.random.default_rng(2).standard_normal((2, 9, 64)).astype(np.float32))
steps = gk.path_ops("avx2"), gn.path_ops("avx2")
kq = [ops.attention_scores(q, kv) for ops in steps]
out["steps"] = bool(np.array_equal(*kq)) and bool(np.array_equal(*[ops.swiglu(q[0], q[1]) for ops in steps]))
print(json.dumps(out))
"""


def cases():
    """name -> (a matrix's GGUF bytes, its type, activations): one token and a batch past a tile, block and K-quant
    types, rows a multiple of 8 (Q4_K repacked) and not."""
    from refllama.formats.ggml_types import GGMLType as QT
    from refllama.formats.ggml_types import byte_shape
    from refllama.numerics import ggml_tables as gt

    rng = np.random.default_rng(0)
    out = {}
    for qtype, N, K in ((QT.Q4_1, 36, 256), (QT.Q8_0, 20, 256), (QT.Q4_K, 40, 512), (QT.Q6_K, 12, 512)):
        raw = rng.integers(0, 256, byte_shape((N, K), qtype), dtype=np.uint8)
        blocks = raw.reshape(N, K // (256 if qtype in (QT.Q4_K, QT.Q6_K) else 32), -1)
        for name in (n for n in ("d", "m", "dmin") if n in gt.LAYOUT[qtype]):  # finite float16 scales
            start, end = gt.LAYOUT[qtype][name]
            blocks[..., start:end] = rng.uniform(-1e-2, 1e-2, blocks.shape[:2]).astype(np.float16)[..., None].view(
                np.uint8)
        for T in (1, 21):
            out[f"{qtype.name}-{T}"] = (raw, qtype, rng.standard_normal((T, K)).astype(np.float32))
    return out


@pytest.mark.skipif(gb.kernel_isa() == "generic", reason="this CPU has no AVX2: its kernels' AVX2 form cannot run here")
def test_the_kernels_compiled_for_an_avx2_host_compute_the_same_bits():
    from refllama.numerics import quant

    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=900,
                       env={**os.environ, **AVX2_HOST}, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert (got["isa"], got["rows"], got["side"], got["krows"]) == ("avx2", 6, 2, 1)  # the narrow forms
    assert all(got["ggml"].values()) and got["steps"], got["ggml"]
    for name, (raw, qtype, x) in cases().items():
        here = x @ quant.QuantMatrix([raw], qtype, x.shape[1]).T
        np.testing.assert_array_equal(np.asarray(got["float32"][name], np.float32), here, err_msg=name)
