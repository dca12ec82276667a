"""Numba's kernels are loaded at load, before the first token: each step of an operations table is called once, then
the pages of the libraries that only loading them needed are handed back to the OS."""

import contextlib
import ctypes
import re
import sys
import threading

import numpy as np


@contextlib.contextmanager
def compile_notice(after_s=2.0):
    """A one-line notice on stderr if loading the kernels takes more than `after_s` seconds: from Numba's cache they
    load in well under a second, so the wait is Numba compiling them, on a first run, which is silent otherwise."""
    timer = threading.Timer(after_s, lambda: print("refllama: Numba is compiling its kernels (on a first run only; "
                                                   "later runs load them from its cache) ...", file=sys.stderr))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def warm_up_steps(ops, head_dim):
    """Call each step of an operations table (refllama.layers.Ops) once, on small arrays of the types a step passes,
    so that Numba loads its kernels now: one loaded after release_loader_pages brings LLVM's pages back. K and V are
    views of the cache, which Numba types as strided (fewer positions than the context) or contiguous (all of them:
    the context's last step): both; so are a batch's gate and up, columns of one fused product. Norms run on rows
    [T, D] and on heads [T, H, HD]."""
    cache, cs = np.zeros((2, 4, head_dim), np.float32), np.zeros((1, head_dim // 2), np.float32)
    x = np.zeros((1, 2, head_dim), np.float32)
    ops.rms_norm(x[0], x[0, 0], 1e-5)
    ops.rms_norm(x, x[0, 0], 1e-5)
    ops.rope["interleaved"](x, cs, cs)
    ops.swiglu(x[0], x[0])
    ops.swiglu(x[0, :, :head_dim // 2], x[0, :, head_dim // 2:])  # strided: a batch's views of the fused product
    ops.geglu(x[0], x[0])  # numerics ggml: builds its GELU table
    for S in (2, 4):
        kq = ops.attention_scores(x, cache[:, :S])
        ops.attention_mix(ops.attention_weights(kq, np.zeros((1, S), np.float32), 0.125), cache[:, :S])


MADV_PAGEOUT = 21  # Linux 5.4+: reclaim these pages now; file-backed ones are read again if touched
MADV_POPULATE_READ = 22  # Linux 5.14+: map these pages now, read in where the page cache lacks them
PAGE = 4096


LOAD_ONLY_LIBRARIES = re.compile(r"/(libllvmlite\.so|libcrypto\.so[.0-9]*)$")  # LLVM; OpenSSL


def map_experts(lw):
    """Map the pages of a layer's experts' matrices (their file's blocks, memory-mapped) now, at load: a decode step
    reads the few experts its token is routed to, most of them for the first time in the first steps, and a page's
    first read through the map is a page fault (a fifth of a synthetic gpt-oss-20b's decode step here). llama.cpp
    reads its weights in at load too. Elsewhere than Linux 5.14 and up, this does nothing."""
    if not sys.platform.startswith("linux"):
        return
    madvise = ctypes.CDLL(None).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    for experts in (v for v in lw.values() if isinstance(v, tuple)):
        for raw in (p for m in experts for p in getattr(m, "parts", ())):
            start = raw.ctypes.data & ~(PAGE - 1)
            madvise(start, raw.ctypes.data + raw.nbytes - start, MADV_POPULATE_READ)  # a refusal changes nothing


def release_loader_pages():
    """Hand back to the OS the pages of the libraries that only loading the kernels uses (~68 MB resident otherwise):
    LLVM, which compiles them or links them from Numba's cache, and OpenSSL, with which Numba hashes a function's
    bytecode to find its cache entry. Running compiled kernels touches neither; should Numba compile again, or
    anything hash, the pages come back from the library files. Elsewhere than Linux, or on older kernels, this
    does nothing."""
    if not sys.platform.startswith("linux"):
        return
    madvise = ctypes.CDLL(None).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if LOAD_ONLY_LIBRARIES.search(fields[-1]) and "w" not in fields[1]:  # read-only: code, constants
                start, end = (int(a, 16) for a in fields[0].split("-"))
                madvise(start, end - start, MADV_PAGEOUT)  # a refusal (EINVAL on old kernels) changes nothing
