"""Fuzz refllama with hostile input by the thousand: GGUF mutants (tiny models, and the default model's header),
HF directory mutants, chat templates, and requests to a running server. The mutators are tests/fuzzing.py's; CI runs
a budget of the same (tests/test_fuzz.py, tests/test_serve_hostile.py).

    python tools/fuzz.py --gguf 5000 --header 200 --hf 1000 --templates 300 --requests 1000 --seed 100000

Prints the outcome counts per kind and each distinct failure (exception type and place) with the first seed and
mutation that gave it; exits 1 if there was any.
"""

import argparse
import collections
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import fuzzing as fz  # noqa: E402

DATA = ROOT / "tests" / "data"


def campaign(name, n, first_seed, make, outcome, failures):
    counts, t0 = collections.Counter(), time.perf_counter()
    for seed in range(first_seed, first_seed + n):
        what = "(not made)"
        try:
            target, what = make(seed)
            counts[outcome(target)] += 1
        except Exception as e:
            frame = traceback.extract_tb(e.__traceback__)[-1]
            place = f"{type(e).__name__} at {Path(frame.filename).name}:{frame.lineno}"
            counts["FAILED"] += 1
            if place not in failures:
                failures[place] = f"{name} seed {seed}: {what}: {str(e)[:200]}"
    print(f"{name}: {n} mutants in {time.perf_counter() - t0:.0f} s: {dict(counts)}", flush=True)


def serve_tiny(port):
    cmd = [sys.executable, "-m", "refllama.serve", "-m", str(DATA / "gguf-llama" / "llama-q8_0.gguf"), "--port",
           str(port), "-t", "1", "-c", "512"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import httpx

    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()["status"] == "ready":
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not start")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", type=int, default=2000, help="mutants of the tiny GGUF models (load and run)")
    p.add_argument("--header", type=int, default=100, help="mutants of the default model's header")
    p.add_argument("--hf", type=int, default=500, help="mutants of the tiny HF directories")
    p.add_argument("--templates", type=int, default=200, help="hostile chat templates")
    p.add_argument("--requests", type=int, default=500, help="fuzzed requests to a server running a tiny model")
    p.add_argument("--seed", type=int, default=100_000, help="first seed (CI's budget uses seeds below 20000)")
    p.add_argument("--port", type=int, default=8765)
    args = p.parse_args(argv)
    failures = {}
    ggufs = sorted(DATA.glob("gguf-*/*.gguf"))
    hfs = sorted(d for d in DATA.glob("tiny-*") if d.is_dir())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)

        def gguf(seed):
            path = tmp / f"g{seed}.gguf"
            return path, fz.gguf_mutant(ggufs[seed % len(ggufs)], path, fz.rng_for(seed))

        def header(seed):
            from refllama.api import default_model_path

            return tmp / "h.gguf", fz.gguf_mutant(default_model_path(), tmp / "h.gguf", fz.rng_for(seed), sparse=True)

        def hf(seed):
            d = tmp / f"d{seed}"
            return d, fz.hf_mutant(hfs[seed % len(hfs)], d, fz.rng_for(seed))

        def template(seed):
            t = fz.template_mutant(fz.rng_for(seed))
            return t, repr(t[:80])

        campaign("gguf", args.gguf, args.seed, gguf, fz.load_outcome, failures)
        campaign("header", args.header, args.seed, header, fz.header_outcome, failures)
        campaign("hf", args.hf, args.seed, hf, fz.load_outcome, failures)
        campaign("templates", args.templates, args.seed, template, lambda t: fz.template_outcome(t, 1.0), failures)
    if args.requests:
        import httpx

        proc = serve_tiny(args.port)
        try:
            with httpx.Client(timeout=60) as client:
                url = f"http://127.0.0.1:{args.port}"

                def request(seed):
                    path_body = fz.request_mutant(fz.rng_for(seed))
                    return path_body, str(path_body)[:150]

                campaign("requests", args.requests, args.seed, request,
                         lambda pb: fz.request_outcome(client, url, *pb), failures)
        finally:
            proc.terminate()
            proc.wait(10)
    for place, first in failures.items():
        print(f"FAILURE {place}\n  first: {first}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
