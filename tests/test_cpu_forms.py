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
from test_ggml_numerics import activations, random_blocks

from refllama.formats.ggml_types import GGMLType as QT
from refllama.numerics import ggml_blocks as gb

pytestmark = pytest.mark.slow  # every kernel recompiled for an AVX2 host in a subprocess (~50 s): the slow tier

AVX2_HOST = {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "+avx2,+fma,+f16c"}

PROBE = """
import json, sys
import numpy as np
from refllama.formats.ggml_types import GGMLType as QT
from refllama.numerics import ggml_blocks as gb, ggml_kernels as gk, ggml_kquants as gq, ggml_numerics as gn, quant
from refllama.numerics import ggml_tables as gt

data = np.load(sys.argv[1])
out = {"isa": gb.ISA, "rows": quant.TILE_N, "side": quant.SIDE, "krows": gq.K_TILE_N, "float32": {}, "ggml": {}}
for name in data["names"]:
    raw, qtype, x = data[name + ".raw"], QT(int(data[name + ".qtype"])), data[name + ".x"]
    out["float32"][name] = (x @ quant.QuantMatrix([raw], qtype, x.shape[1]).T).tolist()
    fast = (gq.NumbaKQuantMatrix if qtype in gq.K_QUANTS else gb.NumbaGgmlMatrix)([raw], qtype, x.shape[1])
    want = gn.GgmlMatrix(raw, qtype, (len(raw), x.shape[1]))
    fast.repacked = want.repacked = gn.repacked(qtype, want.shape, "avx2") is not None
    out["ggml"][name] = bool(np.array_equal(x @ fast.T, x @ want.T))
q = np.random.default_rng(1).standard_normal((3, 4, 64)).astype(np.float32)
kv = gt.round_f16(np.random.default_rng(2).standard_normal((2, 9, 64)).astype(np.float32))
steps = gk.path_ops("avx2"), gn.path_ops("avx2")
kq = [ops.attention_scores(q, kv) for ops in steps]
out["steps"] = bool(np.array_equal(*kq)) and bool(np.array_equal(*[ops.swiglu(q[0], q[1]) for ops in steps]))
print(json.dumps(out))
"""


def cases():
    """name -> (a matrix's GGUF bytes, its type, activations): one token and a batch past a tile, block and K-quant
    types, rows a multiple of 8 (Q4_K repacked) and not."""
    return {f"{qtype.name}-{T}": (random_blocks(qtype, N, K), qtype, activations(T, K))
            for qtype, N, K in ((QT.Q4_1, 36, 256), (QT.Q8_0, 20, 256), (QT.Q4_K, 40, 512), (QT.Q6_K, 12, 512))
            for T in (1, 21)}


@pytest.mark.skipif(gb.kernel_isa() == "generic", reason="this CPU has no AVX2: its kernels' AVX2 form cannot run here")
def test_the_kernels_compiled_for_an_avx2_host_compute_the_same_bits(tmp_path):
    from refllama.numerics import quant

    made = cases()
    np.savez(tmp_path / "cases.npz", names=list(made), **{f"{n}.{k}": v for n, (raw, qtype, x) in made.items()
                                                          for k, v in (("raw", raw), ("qtype", int(qtype)), ("x", x))})
    r = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "cases.npz")], capture_output=True, text=True,
                       timeout=900, env={**os.environ, **AVX2_HOST})
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert (got["isa"], got["rows"], got["side"], got["krows"]) == ("avx2", 6, 2, 1)  # the narrow forms
    assert all(got["ggml"].values()) and got["steps"], got["ggml"]
    for name, (raw, qtype, x) in made.items():
        here = x @ quant.QuantMatrix([raw], qtype, x.shape[1]).T
        np.testing.assert_array_equal(np.asarray(got["float32"][name], np.float32), here, err_msg=name)
