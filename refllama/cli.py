"""What the four commands share: their names, as console scripts and as modules, and --version."""

import argparse
import os
import sys

from . import __version__

SCRIPTS = {"refllama.run": "refllama", "refllama.serve": "refllama-server", "refllama.compare": "refllama-compare",
           "refllama.convert": "refllama-convert"}  # pyproject.toml's [project.scripts] installs these


def parser(module, doc, **kwargs):
    """The argument parser of `module`'s command, named as it was typed (`refllama-server` or `python -m
    refllama.serve`), with --version; the description is the first line of `doc`."""
    typed = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    prog = SCRIPTS[module] if typed == SCRIPTS[module] else f"python -m {module}"
    p = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0], **kwargs)
    p.add_argument("--version", action="version", version=f"refllama {__version__}")
    return p


def add_gpu_layers(p):
    p.add_argument("-ngl", "--n-gpu-layers", type=int, metavar="N",
                   help="llama.cpp's flag, accepted: with --backend cupy every layer runs on the GPU (all or none)")


def gpu_layers(args, p):
    """llama.cpp's -ngl N offloads N layers; a refllama backend runs every layer in one place: a notice, or an error
    where -ngl contradicts --backend."""
    n = args.n_gpu_layers
    if n is None:
        return
    if args.backend == "cupy" and n == 0:
        p.error("-ngl 0 with --backend cupy: the cupy backend runs every layer on the GPU; for none, "
                "use --backend numpy or numba")
    if args.backend != "cupy" and n != 0:
        print(f"{p.prog}: -ngl {n} ignored: layers run on the GPU with --backend cupy, all of them", file=sys.stderr)
    elif args.backend == "cupy":
        print(f"{p.prog}: -ngl {n}: with --backend cupy every layer runs on the GPU", file=sys.stderr)
