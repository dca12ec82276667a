"""One table for a model (the default, or -m GGUF) on this machine: load time, prefill and decode speed, peak memory,
for refllama (numpy, numba, and numba-ggml: numba with numerics "ggml") and, when installed, llama.cpp
(llama-cpp-python) and transformers (fp32).

Each engine runs in its own process with the same thread count, on the same GGUF file and the same 128
prompt tokens (tokenized once, here), then decodes 128 tokens greedily; prefill + decode run --repeat
times in that process and the best time of each counts:
  load     process start until the model is ready for its first token (imports included; Numba's JIT
           cache warm: run the tool twice after a fresh install)
  prefill  128 prompt tokens in one batch, tokens per second
  decode   128 tokens one at a time after the prompt, tokens per second
  peak RSS the process's maximum resident memory

    python tools/bench.py [-m MODEL.gguf] [--threads N] [--repeat 3] [--engines numpy,numba,numba-ggml,llama.cpp,...]
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

N_PROMPT, N_DECODE = 128, 128
TEXT = ("The printing press changed how knowledge moved through Europe. Before Gutenberg, a book was copied by hand, "
        "letter by letter, often in a monastery, and a single Bible could take a scribe more than a year. ") * 6


def process_age():
    """Seconds since this process started (Linux /proc), so load time includes interpreter start and imports."""
    start_ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
    return float(open("/proc/uptime").read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")


def run_refllama(backend, path, threads, ids, numerics="float32"):
    import numpy as np

    import refllama

    refllama.set_threads(threads, backend)
    m = refllama.load(path, backend=backend, n_ctx=N_PROMPT + N_DECODE, numerics=numerics)
    load = process_age()
    forward = m.arch.forward

    def generate():
        t0 = time.perf_counter()
        logits = m._prefill(ids, last_only=True)  # resets the cache
        t1 = time.perf_counter()
        token = int(np.argmax(logits[-1]))
        for _ in range(N_DECODE):
            logits = forward(m.weights, m.config, m.ops, np.asarray([token]), m.cache.n_past, m.cache, True)
            token = int(np.argmax(logits[-1]))
        return t1 - t0, time.perf_counter() - t1
    return load, generate


def run_llamacpp(path, threads, ids):
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(path, n_ctx=N_PROMPT + N_DECODE, n_batch=N_PROMPT, n_threads=threads,
                          n_threads_batch=threads, verbose=False)
    load = process_age()

    def last_logits():  # llama.cpp keeps only the last row's logits when logits_all is off
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))

    def generate():
        llm.reset()  # evaluation starts again at position 0
        t0 = time.perf_counter()
        llm.eval(ids)
        t1 = time.perf_counter()
        token = int(np.argmax(last_logits()))
        for _ in range(N_DECODE):
            llm.eval([token])
            token = int(np.argmax(last_logits()))
        return t1 - t0, time.perf_counter() - t1
    return load, generate


def run_transformers(path, threads, ids):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    d, f = os.path.split(path)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    load = process_age()

    @torch.no_grad()
    def generate():
        t0 = time.perf_counter()
        out = model(torch.tensor([ids]), use_cache=True)  # a new cache each time
        t1 = time.perf_counter()
        past, token = out.past_key_values, out.logits[0, -1].argmax().view(1, 1)
        for _ in range(N_DECODE):
            out = model(token, past_key_values=past, use_cache=True)
            past, token = out.past_key_values, out.logits[0, -1].argmax().view(1, 1)
        return t1 - t0, time.perf_counter() - t1
    return load, generate


def child(engine, path, threads, ids, repeat):
    runs = {"numpy": lambda: run_refllama("numpy", path, threads, ids),
            "numba": lambda: run_refllama("numba", path, threads, ids),
            "numba-ggml": lambda: run_refllama("numba", path, threads, ids, "ggml"),
            "llama.cpp": lambda: run_llamacpp(path, threads, ids),
            "transformers": lambda: run_transformers(path, threads, ids)}
    load, generate = runs[engine]()
    times = [generate() for _ in range(repeat)]  # the best of `repeat`: the least disturbed by other work
    prefill, decode = min(t[0] for t in times), min(t[1] for t in times)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"engine": engine, "load_s": load, "prefill_tok_s": N_PROMPT / prefill,
                      "decode_tok_s": N_DECODE / decode, "peak_rss_mb": peak_mb}))


def prompt_ids(g):
    """The prompt's first N_PROMPT token ids (refllama's tokenizer, equal to llama.cpp's: tests/test_tokenizer.py),
    computed here once so that no engine's process pays for a second tokenizer."""
    from refllama.formats.tokenizer import from_gguf

    return from_gguf(g).encode(TEXT)[:N_PROMPT]


def installed(engine):
    module = {"llama.cpp": "llama_cpp", "transformers": "transformers"}.get(engine)
    if module is None:
        return True
    import importlib.util

    found = importlib.util.find_spec(module) is not None
    return found and (engine != "transformers" or importlib.util.find_spec("torch"))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", help="GGUF file (default: the installed SmolLM2)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--engines", default="numpy,numba,numba-ggml,llama.cpp,transformers")
    p.add_argument("--repeat", type=int, default=3, help="prefill + decode runs per engine; the best time counts")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    args = p.parse_args()
    from refllama import arch
    from refllama.api import default_model_path
    from refllama.formats.gguf_loader import GGUFFile

    path = args.model or default_model_path()
    if args.child:
        return child(args.child, path, args.threads, json.loads(args.ids), args.repeat)
    g = GGUFFile(path)
    cfg = arch.for_gguf(g.string("general.architecture", required=True), path).config_from_gguf(g)
    name = g.string("general.name", os.path.basename(path))
    ids = json.dumps(prompt_ids(g))
    rows = {}
    for engine in args.engines.split(","):
        if not installed(engine):
            print(f"{engine}: not installed, skipped", file=sys.stderr)
            continue
        r = subprocess.run([sys.executable, __file__, "--child", engine, "-m", path, "--threads", str(args.threads),
                            "--ids", ids, "--repeat", str(args.repeat)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{engine}: failed\n{r.stderr[-2000:]}", file=sys.stderr)
            continue
        rows[engine] = json.loads(r.stdout.strip().splitlines()[-1])
    gguf_mb = os.path.getsize(path) / 2**20
    print(f"{name} ({os.path.basename(path)}, {gguf_mb:.0f} MB), {args.threads} threads, {os.cpu_count()} cores, "
          f"{N_PROMPT}-token prompt, {N_DECODE} decoded tokens, best of {args.repeat}\n")
    print("| engine | load (s) | prefill (tok/s) | decode (tok/s) | peak RSS (MB) |")
    print("| --- | --- | --- | --- | --- |")
    for e, r in rows.items():
        print(f"| {e} | {r['load_s']:.2f} | {r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.1f} "
              f"| {r['peak_rss_mb']:.0f} |")

    def ratio(a, b, key):
        if a in rows and b in rows:
            print(f"- {a} / {b} {key.split('_')[0]}: {rows[a][key] / rows[b][key]:.2f}x")
    print()
    for mine in ("numba", "numba-ggml"):
        ratio(mine, "llama.cpp", "decode_tok_s")
        ratio(mine, "llama.cpp", "prefill_tok_s")
    ratio("numpy", "transformers", "decode_tok_s")
    if "numba" in rows:
        kv_mb = (N_PROMPT + N_DECODE) * cfg.n_layer * 2 * cfg.n_head_kv * cfg.head_dim * 4 / 2**20
        ratio_mem = rows["numba"]["peak_rss_mb"] / (2 * gguf_mb + kv_mb)
        print(f"- numba peak RSS / (2 x GGUF + KV cache {kv_mb:.0f} MB): {ratio_mem:.3f}x")


if __name__ == "__main__":
    main()
