"""Array-module shim: the same layer code runs on NumPy (CPU) and CuPy (CUDA).

The backend is chosen once, when weights are placed; layers ask their inputs which module owns them.
"""

import math
import os
import threading
import time

import numpy as np
from threadpoolctl import threadpool_limits

from .errors import RefllamaError

BACKENDS = ("numpy", "numba", "cupy")
NUMERICS = ("float32", "ggml")  # float32 throughout, or llama.cpp's CPU arithmetic (refllama.numerics.ggml_numerics)


def backend_module(name):
    """The array module for a backend name; a clear error when it cannot run here.

    "numba" computes on NumPy arrays, with quantized weights multiplied by Numba kernels (refllama.numerics.quant).
    """
    if name in ("numpy", "numba"):
        return np
    if name == "cupy":
        try:
            import cupy
        except ImportError:
            raise RefllamaError("backend 'cupy' needs CuPy: pip install -e '.[cuda]' in refllama's clone") from None
        try:
            n_gpu = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # CUDA driver missing or broken
            raise RefllamaError(f"backend 'cupy': no usable CUDA GPU ({e})") from None
        if n_gpu == 0:
            raise RefllamaError("backend 'cupy': no CUDA GPU found")
        return cupy
    raise RefllamaError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")


class Placement:
    """Where weights go as a loader reads them: NumPy arrays as they are, or uploaded once to the GPU (CuPy).
    `keep` are the file types a matrix is handed over in (QuantizedTensor; none here); `plan` hears what the model's
    tensors take in float32 and `prepare` sees the file's matrix types, both before any weight is read; `converted`
    names the types kept without a kernel, for the loader's notice."""

    keep = converted = frozenset()

    def __init__(self, xp=np):
        self.xp = xp

    def plan(self, float32_bytes):
        pass

    def prepare(self, qtypes, cfg):
        pass

    def __call__(self, a):  # a weight; a placement may keep a product's matrix in a form of its own
        return self.array(a)

    def unrepacked(self, a):  # a matrix llama.cpp never repacks (a 3-D one it multiplies per head: DeepSeek's v_b)
        return self(a)

    def array(self, a):  # a tensor no product reads (a conv's taps): an array of the placement's module
        return a if self.xp is np else self.xp.asarray(a)


def array_module(x):
    """numpy or cupy, whichever owns x (a weight that is not an array says so: refllama.numerics.gpu.GpuMatrix)."""
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy
    return getattr(x, "array_module", np)


def to_numpy(x):
    """A NumPy copy of x wherever it lives (a no-op for NumPy arrays)."""
    return x.get() if array_module(x) is not np else np.asarray(x)


TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc's time unit, per second
FOLLOW_S = 0.5  # how often threads that follow the free cores look again (a read of /proc/stat: ~50 us)


class CoreWatch:
    """How many of this process's cores other work keeps busy. On Linux: the time those cores spent busy since the
    last reading, less this process's own (its threads count as theirs, spinning or not), in cores, from the
    kernel's counters (/proc/stat, /proc/self/stat); elsewhere the 1-minute load average, which lags a minute and
    counts this process too. A core counts as busy from half its time taken: a thread that shares a core waits a
    scheduler slice (~3 ms) for it, and every other thread waits at the next barrier."""

    def __init__(self):
        affinity = getattr(os, "sched_getaffinity", None)
        self.cores = set(affinity(0)) if affinity else set(range(os.cpu_count() or 1))
        self.last = self.read()
        self.n = None  # the thread count it gave last (count)

    def read(self):  # -> (monotonic seconds, busy ticks of the cores, this process's ticks), or None off Linux
        try:
            busy = 0
            with open("/proc/stat") as f:
                for line in f:
                    name, *ticks = line.split()
                    if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in self.cores:
                        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, ticks[:8])
                        busy += user + nice + system + irq + softirq + steal
            with open("/proc/self/stat") as f:  # utime, stime: the 14th and 15th fields, after the command's ")"
                own = sum(map(int, f.read().rsplit(")", 1)[1].split()[11:13]))
            return time.monotonic(), busy, own
        except (OSError, ValueError):
            return None

    def age(self):
        return time.monotonic() - self.last[0] if self.last else math.inf

    def busy(self):
        """Cores busy with other work since the last reading (or the watch's start); the next reading starts here."""
        now, last = self.read(), self.last
        self.last = now
        if now is None or last is None or now[0] <= last[0]:
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0
            return min(round(load), len(self.cores))
        others = (now[1] - last[1]) - (now[2] - last[2])  # ticks
        return min(max(round(others / ((now[0] - last[0]) * TICKS)), 0), len(self.cores))

    def free(self):  # the cores other work leaves free (1 at least)
        return max(1, len(self.cores) - self.busy())

    def count(self):
        """Threads for the free cores, read again once FOLLOW_S has passed since the last reading."""
        if self.n is None or self.age() >= FOLLOW_S:
            self.n = self.free()
        return self.n


def idle_cores(window=0.1):
    """(this process's cores, how many other work keeps busy), over `window` seconds from now."""
    watch = CoreWatch()
    time.sleep(window)
    return len(watch.cores), watch.busy()


def threads_notice(asked):
    """A one-line warning when `asked` threads (a command's -t) is more than the idle cores, else None."""
    if not asked:
        return None
    cores, busy = idle_cores()
    if asked <= cores - busy:
        return None
    return (f"-t {asked} but only {cores - busy} of {cores} cores are idle ({busy} busy with other work): a thread "
            "whose core is busy makes the others wait for it, which can be many times slower; without -t refllama "
            "follows the idle cores")


CHOSEN = {}  # backend -> its thread count as a caller set it, or a CoreWatch where the count follows the free cores
BLAS = [None]  # the count last given to the process's BLAS
_numba = threading.local()  # the count last given to this thread's Numba pool


def set_threads(n=None, backend="numpy"):
    """Threads for this process's products; returns their number now. `refllama.load` calls it for its backend
    unless the caller has: call it (or pass `load(threads=...)`) to choose. None or 0: the cores other work leaves
    free (CoreWatch), looked at again every FOLLOW_S seconds as the model runs (`follow`), so that a job that starts
    beside refllama takes threads from it and gives them back when it ends.

    numpy and cupy: BLAS gets n threads. numba: the Numba kernels (every weight product) get n, BLAS (only
    attention's small products) 1. Both pools spin while they wait for work, so two full pools take each other's
    cores.
    """
    if n not in (None, 0) and n < 1:
        raise RefllamaError(f"threads must be at least 1, got {n}")
    if n in (None, 0):
        n = CoreWatch()
        time.sleep(0.1)  # a first reading's span
    CHOSEN[backend] = n
    return follow(backend)


def follow(backend):
    """Give this thread's pools the backend's thread count (Numba's count is per calling thread), reading the free
    cores again if they are followed and FOLLOW_S has passed; returns the count. Model.forward calls it each step."""
    chosen = CHOSEN.get(backend)
    if chosen is None:
        return None
    n = chosen.count() if isinstance(chosen, CoreWatch) else chosen
    blas = 1 if backend == "numba" else n
    if BLAS[0] != blas:
        threadpool_limits(limits=blas, user_api="blas")
        BLAS[0] = blas
    if backend == "numba":
        import numba

        n = min(n, numba.config.NUMBA_NUM_THREADS)
        if getattr(_numba, "n", None) != n:
            numba.set_num_threads(n)
            _numba.n = n
    return n


def version():
    """refllama's version: the installed package's, else (a source tree pip has not installed) pyproject.toml's."""
    import importlib.metadata

    try:
        return importlib.metadata.version("refllama")
    except importlib.metadata.PackageNotFoundError:
        import re
        from pathlib import Path

        text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text(encoding="utf-8")
        return re.search(r'^version = "([^"]+)"', text, re.M).group(1)
