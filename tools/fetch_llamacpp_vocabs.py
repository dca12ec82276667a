"""Fetch llama.cpp's tokenizer suite: the vocabulary-only GGUFs and their test inputs/outputs
(vendor/llama.cpp/models/ggml-vocab-*) from the llama-cpp-python sdist on PyPI, into a cache the tests read.

    python tools/fetch_llamacpp_vocabs.py [--sdist llama_cpp_python-0.3.36.tar.gz]

The cache is $REFLLAMA_CACHE/llama.cpp-<version>/vocab (default ~/.cache/refllama); a filled cache is kept.
The sdist (~77 MB) is downloaded with pip to a temporary folder and removed; about 63 MB of files stay.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

VERSION = "0.3.36"  # llama-cpp-python; its vendor/llama.cpp is the source every stored llama.cpp reference came from


def cache_dir():
    base = Path(os.environ.get("REFLLAMA_CACHE") or Path.home() / ".cache" / "refllama")
    return base / f"llama.cpp-{VERSION}" / "vocab"


def extract(sdist, dest):
    """The suite's files from the sdist into dest, written to a sibling folder and renamed (never half there)."""
    tmp = Path(tempfile.mkdtemp(prefix=".vocab-", dir=dest.parent))
    try:
        with tarfile.open(sdist) as tar:
            for m in tar.getmembers():
                name = Path(m.name).name
                if m.isfile() and "/vendor/llama.cpp/models/" in m.name and name.startswith("ggml-vocab-"):
                    with tar.extractfile(m) as src, open(tmp / name, "wb") as out:
                        shutil.copyfileobj(src, out)
        if not any(tmp.glob("*.gguf")):
            raise SystemExit(f"{sdist}: no vendor/llama.cpp/models/ggml-vocab-*.gguf in it")
        (tmp / "VERSION").write_text(f"llama-cpp-python {VERSION}\n")
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdist", help=f"a llama_cpp_python-{VERSION}.tar.gz already downloaded")
    args = ap.parse_args(argv)
    dest = cache_dir()
    if (dest / "VERSION").exists():
        print(f"{dest}: already there")
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    if args.sdist:
        extract(Path(args.sdist), dest)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                            f"llama-cpp-python=={VERSION}", "-d", tmp], check=True)
            extract(next(Path(tmp).glob("llama_cpp_python-*.tar.gz")), dest)
    print(f"{dest}: {len(list(dest.glob('*.gguf')))} vocabularies")


if __name__ == "__main__":
    main()
