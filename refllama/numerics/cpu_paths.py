"""llama.cpp's CPU paths: which arithmetic its CPU backend computes on a host, and which of them numerics "ggml"
reproduces. ggml-cpu picks each kernel's form at build time by the instruction sets the build targets (its
`#if defined(__AVX512F__)`, `__AVX2__`, `__ARM_NEON` branches: lane counts of the float32 and float16 sums,
ggml_v_expf's ending, which types it repacks), and a native build targets its host, so the path is the host's. The
integer sums are exact on every path; the float steps around them are not (docs/ggml-numerics.md, "Which CPU
path", lists what differs between the two x86 paths reproduced here)."""

import platform

# name -> (what a host needs, in LLVM's feature names; what llama.cpp's build for it computes differently)
PATHS = {
    "avx512-vnni": (("avx512f", "avx512bw", "avx512vl", "avx512vnni"),
                    "16-lane float sums, ggml_v_expf's AVX-512 scaling, Q2_K repacked"),
    "avx512": (("avx512f", "avx512bw", "avx512vl"),
               "avx512-vnni's float sums, but the kernels with a VNNI form (the tiled K-quant one) without it"),
    "avx2": (("avx2", "fma", "f16c"), "8-lane float sums, ggml_v_expf's AVX2 ending, Q2_K not repacked"),
    "neon-i8mm": (("neon", "dotprod", "fullfp16", "i8mm"), "neon-dotprod's float sums, its repacked forms with i8mm "
                  "(Apple M2 and up)"),
    "neon-dotprod": (("neon", "dotprod", "fullfp16"), "ARM's 4-lane sums, float16 sums in float16 (Apple M1 and up), "
                     "its repacked forms with dotprod"),
}
EMULATED = {"numpy": ("avx512-vnni", "avx2", "neon-i8mm", "neon-dotprod"),  # backend -> the paths numerics "ggml"
            "numba": ("avx512-vnni", "avx2"), "cupy": ("avx512-vnni",)}  # computes there, to the bit (see TYPES)
TYPES = {path: {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "F16", "F32"}
         for path in ("neon-i8mm", "neon-dotprod")}  # paths reproduced for these matrix types only (not yet Q5_1)
NEAREST = {"avx512": "avx512-vnni"}  # a path not emulated -> the emulated one that differs from it least
BUILT = {  # name -> the flags llama_print_system_info() shows "= 1" for a build that takes it
    "avx512-vnni": ("AVX512", "AVX512_VNNI"), "avx512": ("AVX512",), "avx2": ("AVX2", "FMA", "F16C"),
    "neon-i8mm": ("NEON", "DOTPROD", "MATMUL_INT8"), "neon-dotprod": ("NEON", "DOTPROD"),
}


def llamacpp_path(system_info):
    """The path a llama.cpp build computes, from its llama_print_system_info() ("CPU : SSE3 = 1 | AVX2 = 1 | ...");
    None for one it does not name."""
    on = {flag.split("=")[0].strip() for flag in system_info.split("|") if flag.split("=")[-1].strip() == "1"}
    on = {flag.rsplit(" : ", 1)[-1] for flag in on}  # the first flag follows the backend's name
    return next((name for name, flags in BUILT.items() if all(f in on for f in flags)), None)


def host_path(features=None, machine=None):
    """The path a native llama.cpp build takes on this host (or on one with `features`, LLVM's names, and
    `machine`, platform.machine()'s), the most capable first; None where it has no SIMD path ggml-cpu names."""
    if features is None:
        import llvmlite.binding as llvm  # here: LLVM's library maps ~60 MB, which numerics float32 never needs

        features = {name for name, on in llvm.get_host_cpu_features().items() if on}
    machine = (machine or platform.machine()).lower()
    arm = machine.startswith(("arm", "aarch64"))
    for name, (needs, _) in PATHS.items():
        if name.startswith("neon") == arm and all(f in features for f in needs):
            return name
    return None


def choose(cpu_path=None, backend="numpy", qtypes=set):
    """-> (the path numerics "ggml" computes on `backend`, a notice or None). `cpu_path` None: the host's, where
    reproduced (for the model's matrix types: `qtypes()`, their names, asked for only where the host's path is
    reproduced for some types, TYPES), else the nearest reproduced one, with a notice saying so; a name: that path,
    which must be reproduced on that backend."""
    host, emulated = host_path(), EMULATED[backend]
    if cpu_path is not None:
        if cpu_path not in PATHS:
            raise ValueError(f"unknown cpu path {cpu_path!r}: llama.cpp's paths are {', '.join(PATHS)}")
        if cpu_path not in emulated:
            elsewhere = [b for b, paths in EMULATED.items() if cpu_path in paths]
            raise ValueError(f"cpu path {cpu_path!r} is not one numerics 'ggml' reproduces on {backend} (it differs "
                             f"in: {PATHS[cpu_path][1]}); it reproduces {', '.join(emulated)} there"
                             + (f", and {cpu_path} on {', '.join(elsewhere)}" if elsewhere else ""))
        return cpu_path, None
    uncovered = sorted(set(qtypes()) - TYPES[host]) if host in TYPES and host in emulated else []
    if host in emulated and not uncovered:
        return host, None
    chosen = NEAREST.get(host, emulated[0])
    seen = f"this host's llama.cpp takes the {host} path" if host else "this host has no SIMD path of llama.cpp's"
    if host in emulated:
        return chosen, (f"{seen}, which numerics 'ggml' reproduces for {', '.join(sorted(TYPES[host]))} matrices "
                        f"only (this model has {', '.join(uncovered)}); it computes {chosen}'s arithmetic, so "
                        "llama.cpp built here differs from it in the last bits")
    elsewhere = [b for b, paths in EMULATED.items() if host in paths]
    return chosen, (f"{seen}, which numerics 'ggml' does not reproduce on {backend}"
                    + (f" (it does on {', '.join(elsewhere)})" if elsewhere else "")
                    + f"; it computes {chosen}'s arithmetic, so llama.cpp built here differs from it in the last bits")
