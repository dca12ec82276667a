"""Threads right by default: `refllama.load` sets its backend's thread pools as the CLI does, unless the caller has,
and threads left to refllama follow the cores other work leaves free as the model runs."""

import json
import subprocess
import sys

import numba
import pytest

from refllama import xp

pytestmark = pytest.mark.slow  # Numba's thread pools, its kernels compiled cold: the slow tier

PROBE = """
import json, numba, refllama
from threadpoolctl import threadpool_info
from refllama import xp
{before}
m = refllama.load(backend="numba", n_ctx=64{threads})
blas = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
watch = xp.CHOSEN["numba"]
print(json.dumps({{"numba": numba.get_num_threads(), "blas": blas,
                  "followed": isinstance(watch, xp.CoreWatch) and watch.n}}))
"""

FOLLOWED = """
import json, subprocess, sys, time, numba, refllama
from refllama import xp

xp.FOLLOW_S = 0.3
m = refllama.load(backend="numba", n_ctx=64)
m.forward([1], 0)
quiet = numba.get_num_threads()
burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(len(xp.CoreWatch().cores) - 1)]
try:
    time.sleep(0.6)
    m.forward([2], 1)  # looks again: the burners have had the cores for FOLLOW_S and more
    busy = numba.get_num_threads()
finally:
    for b in burners:
        b.kill()
print(json.dumps({"quiet": quiet, "busy": busy}))
"""

multicore = pytest.mark.skipif(len(xp.CoreWatch().cores) < 2 or numba.config.NUMBA_NUM_THREADS < 2,
                               reason="one core: no thread count to choose")


def probe(code):
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_numba_load_follows_the_idle_cores_with_the_kernels_and_gives_blas_one(model):
    got = probe(PROBE.format(before="", threads=""))
    assert got["followed"] and got["numba"] == got["followed"] and set(got["blas"]) == {1}


@pytest.mark.parametrize("before, threads", [("refllama.set_threads(1, 'numba')", ""), ("", ", threads=1")])
def test_the_callers_choice_stands(model, before, threads):
    got = probe(PROBE.format(before=before, threads=threads))
    assert got["numba"] == 1 and got["followed"] is False


class Readings(xp.CoreWatch):
    """A CoreWatch of `cores` over given readings: (busy ticks of the cores, this process's ticks) at clock[0]."""

    def __init__(self, cores, ticks, clock):
        self.ticks, self.clock = iter(ticks), clock
        super().__init__()
        self.cores = set(range(cores))

    def read(self):
        return (self.clock[0], *next(self.ticks))


def test_other_work_is_the_cores_busy_time_less_this_process_own():
    t, clock = xp.TICKS, [0.0]
    watch = Readings(4, [(0, 0), (3 * t, t), (5 * t, 3 * t), (5.7 * t, 3.1 * t)], clock)
    clock[0] = 1.0
    assert watch.busy() == 2  # three cores' time in a second, one of them this process's own threads
    clock[0] = 2.0
    assert watch.busy() == 0  # two cores' time, all of it this process's
    clock[0] = 3.0
    assert watch.free() == 3  # 0.6 of a core taken: counted busy (a thread there would wait for its slices)
    full = Readings(2, [(0, 0), (2 * t, 0)], clock)
    clock[0] = 4.0
    assert full.free() == 1  # every core busy: one thread still runs


@multicore
def test_followed_threads_change_as_other_work_comes_and_goes(monkeypatch):
    t, clock = xp.TICKS, [0.0]
    monkeypatch.setattr(xp.time, "monotonic", lambda: clock[0])
    watch = Readings(2, [(0, 0), (0, 0), (t, 0), (t, 0)], clock)
    clock[0] = 1.0
    watch.n = watch.free()
    monkeypatch.setitem(xp.CHOSEN, "numba", watch)
    before, seen = numba.get_num_threads(), []
    try:
        for step in (0.1, 1.0, 1.0):  # seconds since the last step: less than FOLLOW_S keeps the count
            clock[0] += step
            seen.append((xp.follow("numba"), numba.get_num_threads()))
    finally:
        numba.set_num_threads(before)
        xp._numba.n = before
    assert seen == [(2, 2), (1, 1), (2, 2)]  # a core taken by other work for a second, then given back


@multicore
def test_a_job_started_beside_a_running_model_takes_its_threads(model):
    got = probe(FOLLOWED)
    assert got["busy"] < len(xp.CoreWatch().cores) and got["busy"] <= got["quiet"]


def test_threads_beyond_the_idle_cores_get_a_notice(monkeypatch):
    monkeypatch.setattr(xp, "idle_cores", lambda window=0.1: (2, 1))
    assert "-t 2 but only 1 of 2 cores are idle" in xp.threads_notice(2)
    assert xp.threads_notice(1) is None and xp.threads_notice(None) is None and xp.threads_notice(0) is None
