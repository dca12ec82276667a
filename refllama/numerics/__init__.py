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

from ..layers import FLOAT32

OPS = {  # (backend, numerics) -> the module whose OPS table computes the steps; refllama.layers' own otherwise
    ("numba", "float32"): "refllama.numerics.numba_ops",  # a decode step's small steps as Numba kernels
    ("cupy", "float32"): "refllama.numerics.gpu",  # a prefill's small steps as CUDA kernels
    ("numpy", "ggml"): "refllama.numerics.ggml_numerics",  # the readable NumPy emulation of llama.cpp
    ("cupy", "ggml"): "refllama.numerics.ggml_numerics",
    ("numba", "ggml"): "refllama.numerics.ggml_kernels",  # the same arithmetic as Numba kernels
}


def ops_for(backend, numerics, arch, cpu_path=None):
    """The operations table (refllama.layers.Ops) of a backend and numerics for an architecture, chosen once, at
    load: the forwards call every step whose arithmetic a numerics sets through it. A numerics module is imported
    only when chosen; one that follows llama.cpp's graph scales q first only where that architecture's graph does;
    `cpu_path` (numerics "ggml"): which of llama.cpp's CPU paths its float steps take."""
    if (backend, numerics) not in OPS:
        return FLOAT32
    module = importlib.import_module(OPS[backend, numerics])
    ops = module.path_ops(cpu_path) if cpu_path else module.OPS  # a path: numerics "ggml" only
    return ops._replace(q_first=False) if ops.q_first and not getattr(arch, "LLAMACPP_Q_SCALED", False) else ops


def placement(backend, xp, numerics="float32", in_file=None, repack=True, cpu_path=None):
    """Where the backend wants its weights, given to the loader so that each tensor is placed as it is read.
    `in_file`: numpy's choice between file-form and float32 matrices (None: by the model's size, FilePlacement),
    cupy's between 16-bit and quantized matrices kept so (None, True) and widened to float32 (False);
    `repack`: numerics "ggml"'s products as llama.cpp's repacked x86 forms (ggml_numerics.REPACK) or its vec_dot;
    `cpu_path`: its float steps' CPU path (refllama.numerics.cpu_paths)."""
    if numerics == "ggml":
        if backend == "numba":
            from .ggml_kernels import GgmlNumbaPlacement

            return GgmlNumbaPlacement(xp, repack, cpu_path or "avx512-vnni")
        from .ggml_numerics import GgmlPlacement

        return GgmlPlacement(xp, repack, cpu_path or "avx512-vnni")
    if backend == "numba":
        from .quant import NumbaPlacement

        return NumbaPlacement(in_file)
    if backend == "numpy":
        from .matrices import FilePlacement

        return FilePlacement(in_file)
    from .gpu import GpuPlacement

    return GpuPlacement(xp, in_file)  # cupy
