"""Array-module shim: the same layer code runs on NumPy (CPU) and CuPy (CUDA).

The backend is chosen once, when weights are placed; layers ask their inputs which module owns them.
"""

import os

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

    def __call__(self, a):
        return a if self.xp is np else self.xp.asarray(a)


def array_module(x):
    """numpy or cupy, whichever owns x (a weight that is not an array says so: refllama.numerics.gpu.GpuHalfMatrix)."""
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy
    return getattr(x, "array_module", np)


def to_numpy(x):
    """A NumPy copy of x wherever it lives (a no-op for NumPy arrays)."""
    return x.get() if array_module(x) is not np else np.asarray(x)


def cores_and_busy():
    """(the cores this process may use, how many of them other work keeps busy: the 1-minute load average, rounded)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    busy = round(os.getloadavg()[0]) if hasattr(os, "getloadavg") else 0
    return cores, min(busy, cores)


def default_threads():
    """CPU threads for BLAS: the cores this process may use, minus those other work keeps busy (1 at least).

    BLAS threads that find their core taken by other work wait for it: a thread per idle core is fastest
    (docs/performance.md, Threads).
    """
    cores, busy = cores_and_busy()
    return max(1, cores - busy)


def threads_notice(asked):
    """A one-line warning when `asked` threads (a command's -t) is more than the idle cores, else None."""
    cores, busy = cores_and_busy()
    if not asked or asked <= cores - busy:
        return None
    return (f"-t {asked} but only {cores - busy} of {cores} cores are idle (the load average says {busy} are busy): "
            "a thread whose core is busy makes the others wait for it, which can be many times slower; "
            "-t 0 takes the idle cores")


THREADS_SET = set()  # the backends whose threads were set in this process (by the caller, or by a first load)


def set_threads(n=None, backend="numpy"):
    """Threads for this process's products (None or 0: default_threads()); returns n. `refllama.load` calls it for
    its backend unless the caller has: call it (or pass `load(threads=...)`) to choose.

    numpy and cupy: BLAS gets n threads. numba: the Numba kernels (every weight product) get n, BLAS (only
    attention's small products) 1. Both pools spin while they wait for work, so two full pools take each other's
    cores.
    """
    n = default_threads() if n in (None, 0) else n
    if n < 1:
        raise RefllamaError(f"threads must be at least 1, got {n}")
    if backend == "numba":
        import numba

        threadpool_limits(limits=1, user_api="blas")
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    else:
        threadpool_limits(limits=n)
    THREADS_SET.add(backend)
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
