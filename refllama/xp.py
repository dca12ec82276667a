"""Array-module shim: the same layer code runs on NumPy (CPU) and CuPy (CUDA).

The backend is chosen once, when weights are placed; layers ask their inputs which module owns them.
"""

import numpy as np

from .errors import RefllamaError

BACKENDS = ("numpy", "cupy")


def backend_module(name):
    """The array module for a backend name; a clear error when it cannot run here."""
    if name == "numpy":
        return np
    if name == "cupy":
        try:
            import cupy
        except ImportError:
            raise RefllamaError("backend 'cupy' needs CuPy: pip install 'refllama[cuda]'") from None
        try:
            n_gpu = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # CUDA driver missing or broken
            raise RefllamaError(f"backend 'cupy': no usable CUDA GPU ({e})") from None
        if n_gpu == 0:
            raise RefllamaError("backend 'cupy': no CUDA GPU found")
        return cupy
    raise RefllamaError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}")


def array_module(x):
    """numpy or cupy, whichever owns x."""
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def to_numpy(x):
    """A NumPy copy of x wherever it lives (a no-op for NumPy arrays)."""
    return x.get() if array_module(x) is not np else np.asarray(x)
