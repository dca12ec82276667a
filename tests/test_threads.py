"""Threads right by default: `refllama.load` sets its backend's thread pools as the CLI does, unless the caller has."""

import json
import subprocess
import sys

import pytest

PROBE = """
import json, numba, refllama
from threadpoolctl import threadpool_info
from refllama.xp import default_threads
{before}
idle = default_threads()
m = refllama.load(backend="numba", n_ctx=64{threads})
blas = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
print(json.dumps({{"numba": numba.get_num_threads(), "blas": blas, "default": idle}}))
"""


def probe(before="", threads=""):
    r = subprocess.run([sys.executable, "-c", PROBE.format(before=before, threads=threads)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_numba_load_gives_the_kernels_the_idle_cores_and_blas_one(model):
    got = probe()
    assert got["numba"] == got["default"] and set(got["blas"]) == {1}


@pytest.mark.parametrize("before, threads", [("refllama.set_threads(1, 'numba')", ""), ("", ", threads=1")])
def test_the_callers_choice_stands(model, before, threads):
    assert probe(before, threads)["numba"] == 1


def test_threads_beyond_the_idle_cores_get_a_notice(monkeypatch):
    from refllama import xp

    monkeypatch.setattr(xp, "cores_and_busy", lambda: (2, 1))
    monkeypatch.setattr(xp.os, "getloadavg", lambda: (1.0, 1.0, 1.0))
    assert "-t 2 but only 1 of 2 cores are idle" in xp.threads_notice(2)
    assert xp.threads_notice(1) is None and xp.threads_notice(None) is None and xp.threads_notice(0) is None
