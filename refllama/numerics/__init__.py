"""How the forward computes, apart from the math it computes: the operations tables of the numerics, the weight
matrices that stay quantized or in float16, and the Numba kernels that multiply them. A learner can skip this package:
the formulas are refllama.layers; with numerics "float32" on numpy every step is one of them.

    (backend, numerics)   operations table            weights
    numpy, float32        refllama.layers.FLOAT32     matrices.FileMatrix above 1B parameters, else float32 arrays
    cupy, float32         gpu.OPS                     gpu.GpuMatrix: float16/bfloat16 and GGUF's quantized matrices
                                                      kept as stored on the GPU, F32 as arrays there (a decode step:
                                                      gpu_decode, one graph)
    numba, float32        numba_ops.OPS               quant.QuantMatrix: GGUF blocks read in place by Numba kernels;
                                                      the other types as numpy keeps them
    numpy/cupy, ggml      ggml_numerics.OPS           ggml_numerics.GgmlMatrix: llama.cpp's integer dot products
    numba, ggml           ggml_kernels.OPS            the same as Numba / LLVM IR kernels

Shared facts: cpu_paths (llama.cpp's CPU paths, the host's, which ones numerics "ggml" reproduces), ggml_tables
(block layouts, float16, expf's constants), ir (LLVM IR helpers), block_ir (GGUF blocks unpacked in IR), matrices
(the weight-matrix protocol, fused matrices, file-form matrices), kernel_pages (kernels loaded before the loader's
pages are released).
"""

import importlib
from typing import NamedTuple

from ..layers import FLOAT32, Ops
from ..xp import Placement, backend_module
from . import cpu_paths

OPS = {  # (backend, numerics) -> the module whose OPS table computes the steps; refllama.layers' own otherwise
    ("numba", "float32"): "refllama.numerics.numba_ops",  # a decode step's small steps as Numba kernels
    ("cupy", "float32"): "refllama.numerics.gpu",  # a prefill's small steps as CUDA kernels
    ("numpy", "ggml"): "refllama.numerics.ggml_numerics",  # the readable NumPy emulation of llama.cpp
    ("cupy", "ggml"): "refllama.numerics.ggml_numerics",
    ("numba", "ggml"): "refllama.numerics.ggml_kernels",  # the same arithmetic as Numba kernels
}


class Numerics(NamedTuple):
    """What a model computes with, resolved once at load (`resolve`): the numerics' name ("float32" or "ggml"), the
    placement the loader puts each weight through, the operations table, and in numerics "ggml" llama.cpp's CPU path
    and repack; `notice`: what the user is told about the path chosen, or None."""

    name: str
    placement: Placement
    table: Ops
    cpu_path: str | None = None
    repack: bool = False
    notice: str | None = None

    def ops(self, arch):  # -> the operations table for an architecture module
        """The table as the architecture's llama.cpp graph orders its steps: a numerics that follows llama.cpp's
        graph scales q before q.k only where that graph does (arch LLAMACPP_Q_SCALED)."""
        if self.table.q_first and not getattr(arch, "LLAMACPP_Q_SCALED", False):
            return self.table._replace(q_first=False)
        return self.table


def resolve(backend, numerics="float32", cpu_path=None, in_file=None, repack=True, qtypes=set, xp=None):  # -> Numerics
    """The numerics of a backend, chosen once, at load; a numerics module is imported only when chosen.
    `cpu_path` (numerics "ggml"): which of llama.cpp's CPU paths to reproduce, None for the host's where reproduced
    (for the model's matrix types, `qtypes()`: cpu_paths.choose), else the nearest, with a notice; a ValueError
    names a path not reproduced on `backend`. `in_file`: numpy's choice between file-form and float32 matrices
    (None: by the model's size, FilePlacement), cupy's between 16-bit and quantized matrices kept so (None, True)
    and widened to float32 (False); `repack`: numerics "ggml"'s products as llama.cpp's repacked x86 forms
    (ggml_numerics.REPACK) or its vec_dot. `xp`: the backend's array module, None for refllama.xp's (after the path
    is chosen, so that a path not reproduced is named before a backend that is missing)."""
    notice = None
    if numerics == "ggml":
        cpu_path, notice = cpu_paths.choose(cpu_path, backend, qtypes)
    xp = xp or backend_module(backend)
    table = FLOAT32
    if (backend, numerics) in OPS:
        module = importlib.import_module(OPS[backend, numerics])
        table = module.path_ops(cpu_path) if cpu_path else module.OPS  # a path: numerics "ggml" only
    return Numerics(numerics, _placement(backend, xp, numerics, in_file, repack, cpu_path), table, cpu_path,
                    numerics == "ggml" and repack, notice)


def _placement(backend, xp, numerics, in_file, repack, cpu_path):  # -> where the backend wants its weights
    if numerics == "ggml":
        if backend == "numba":
            from .ggml_kernels import GgmlNumbaPlacement

            return GgmlNumbaPlacement(xp, repack, cpu_path)
        from .ggml_numerics import GgmlPlacement

        return GgmlPlacement(xp, repack, cpu_path)
    if backend == "numba":
        from .quant import NumbaPlacement

        return NumbaPlacement(in_file)
    if backend == "numpy":
        from .matrices import FilePlacement

        return FilePlacement(in_file)
    from .gpu import GpuPlacement

    return GpuPlacement(xp, in_file)  # cupy
