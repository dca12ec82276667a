"""One table for a model (the default, -m GGUF or -m HF directory) on this machine: load time, prefill and decode
speed, peak memory, for refllama (numpy, numba, and numba-ggml: numba with numerics "ggml") and, when installed,
llama.cpp (llama-cpp-python, GGUF) and transformers (float32 from a GGUF; an HF directory in its own dtype, bf16).

Each engine runs in its own process with the same thread count, on the same file and the same prompt tokens
(tokenized once, here), then decodes greedily; prefill + decode run --repeat times in that process and the best
time of each counts:
  load     process start until the model is ready for its first token (imports included; Numba's JIT
           cache warm: run the tool twice after a fresh install)
  prefill  --prompt tokens (128) in one batch, tokens per second
  decode   --decode tokens (128) one at a time after the prompt, tokens per second
  peak RSS the process's maximum resident memory; anon / file: its anonymous and file-backed resident memory at the
           end (weights kept as the file maps them are file-backed, and the kernel can drop them under pressure)
The line above the table is this machine's memory bandwidth (a parallel read of 1 GiB, best of 5): decode of a
model too big for the caches cannot run faster than its weights' bytes / bandwidth.

Threads: each engine's default unless --threads says: refllama follows the cores other work leaves free
(refllama.set_threads), llama.cpp and transformers take every core. --busy runs every engine a second time with one
core kept busy by another process (a Python loop, started a second before the engine and stopped after it), and
reports the speed each keeps. --cpu-path picks numba-ggml's CPU path (numerics "ggml"); the llama.cpp row names the
path its build takes. To run refllama's kernels as an AVX2-only host compiles them, set
NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=+avx2,+fma,+f16c (Numba's own cache keeps them apart).

    python tools/bench.py [-m MODEL] [--threads N] [--busy] [--repeat 3] [--rounds 1] [--prompt 128 --decode 128]
                          [--engines numpy,numba,...] [--cpu-path avx2]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

N_PROMPT, N_DECODE = 128, 128  # the defaults of --prompt and --decode
TEXT = ("The printing press changed how knowledge moved through Europe. Before Gutenberg, a book was copied by hand, "
        "letter by letter, often in a monastery, and a single Bible could take a scribe more than a year. ") * 6


def process_age():
    """Seconds since this process started (Linux /proc), so load time includes interpreter start and imports."""
    start_ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
    return float(open("/proc/uptime").read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")


def memory_bandwidth(threads):
    """Bytes per second this machine reads from memory: a parallel Numba sum over 1 GiB (far past every cache)."""
    import numba
    import numpy as np

    @numba.njit(parallel=True, cache=False)
    def total(a):
        s = 0
        for i in numba.prange(len(a)):
            s += a[i]
        return s

    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    a = np.ones(1 << 27, np.int64)
    total(a[:1024])
    best = min(_timed(total, a) for _ in range(5))
    return a.nbytes / best


def _timed(f, *args):
    t0 = time.perf_counter()
    f(*args)
    return time.perf_counter() - t0


def resident():
    """(peak, anonymous now, file-backed now) resident MB of this program (/proc/self/status; the peak is VmHWM,
    which starts again at exec, where ru_maxrss would count the process this one was forked from)."""
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return tuple(int(fields[k].split()[0]) / 1024 for k in ("VmHWM", "RssAnon", "RssFile"))


def run_refllama(backend, path, threads, ids, numerics="float32", cpu_path=None):
    import numpy as np

    import refllama

    refllama.set_threads(threads, backend)  # 0: its default, the free cores followed
    m = refllama.load(path, backend=backend, n_ctx=len(ids) + N_DECODE, numerics=numerics, cpu_path=cpu_path)
    load = process_age()
    facts = {"cpu_path": m.cpu_path}

    def generate():
        t0 = time.perf_counter()
        logits = m._prefill(ids, last_only=True)  # resets the cache
        t1 = time.perf_counter()
        token = int(np.argmax(logits[-1]))
        for _ in range(N_DECODE):
            logits = m.forward([token], m.cache.n_past, last_only=True)
            token = int(np.argmax(logits[-1]))
        facts["threads"] = refllama.xp.follow(backend)  # at the end: the count it followed to
        return t1 - t0, time.perf_counter() - t1
    return load, generate, facts


def run_llamacpp(path, threads, ids):
    import llama_cpp
    import numpy as np

    from refllama.numerics.cpu_paths import llamacpp_path

    threads = threads or os.cpu_count()
    llm = llama_cpp.Llama(path, n_ctx=len(ids) + N_DECODE, n_batch=len(ids), n_threads=threads,
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
    return load, generate, {"cpu_path": llamacpp_path(llama_cpp.llama_print_system_info().decode()), "threads": threads}


def run_transformers(path, threads, ids):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads or os.cpu_count())
    if os.path.isdir(path):  # an HF directory in its own dtype: transformers' bf16 CPU path
        model = AutoModelForCausalLM.from_pretrained(path, dtype="auto").eval()
    else:
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
    return load, generate, {"threads": torch.get_num_threads()}


def child(engine, path, threads, ids, repeat, cpu_path):
    runs = {"numpy": lambda: run_refllama("numpy", path, threads, ids),
            "numba": lambda: run_refllama("numba", path, threads, ids),
            "numba-ggml": lambda: run_refllama("numba", path, threads, ids, "ggml", cpu_path),
            "llama.cpp": lambda: run_llamacpp(path, threads, ids),
            "transformers": lambda: run_transformers(path, threads, ids)}
    load, generate, facts = runs[engine]()
    times = [generate() for _ in range(repeat)]  # the best of `repeat`: the least disturbed by other work
    prefill, decode = min(t[0] for t in times), min(t[1] for t in times)
    peak_mb, anon, file = resident()
    print(json.dumps({"engine": engine, "load_s": load, "prefill_tok_s": len(ids) / prefill,
                      "decode_tok_s": N_DECODE / decode, "peak_rss_mb": peak_mb, "anon_mb": anon, "file_mb": file,
                      **facts}))


def prompt_ids(path, n):
    """The prompt's first n token ids (refllama's tokenizer, equal to llama.cpp's: tests/test_tokenizer.py), computed
    here once so that no engine's process pays for a second tokenizer; the text repeats until it is long enough."""
    from refllama.formats.gguf_loader import GGUFFile
    from refllama.formats.tokenizer import from_gguf, from_hf_dir

    tok = from_hf_dir(path)[0] if os.path.isdir(path) else from_gguf(GGUFFile(path))
    ids = tok.encode(TEXT)
    return (ids * (n // len(ids) + 1))[:n]


def installed(engine):
    module = {"llama.cpp": "llama_cpp", "transformers": "transformers"}.get(engine)
    if module is None:
        return True
    import importlib.util

    found = importlib.util.find_spec(module) is not None
    return found and (engine != "transformers" or importlib.util.find_spec("torch"))


def main():
    global N_DECODE  # the children's decode count, from --decode
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", help="GGUF file or HF directory (default: the installed SmolLM2)")
    p.add_argument("--prompt", type=int, default=N_PROMPT, help="prompt tokens (default %(default)s)")
    p.add_argument("--decode", type=int, default=N_DECODE, help="decoded tokens (default %(default)s)")
    p.add_argument("--threads", type=int, default=0, help="threads for every engine (default: each one's own)")
    p.add_argument("--busy", action="store_true", help="run each engine again with one core kept busy")
    p.add_argument("--cpu-path", help="numba-ggml's CPU path (default: this host's)")
    p.add_argument("--engines", default="numpy,numba,numba-ggml,llama.cpp,transformers")
    p.add_argument("--repeat", type=int, default=3, help="prefill + decode runs per engine; the best time counts")
    p.add_argument("--rounds", type=int, default=1, help="run the engines in turn this many times, each in a fresh "
                   "process (a shared machine's speed moves between runs minutes apart: each round's ratios are of "
                   "neighbouring runs); the table takes each engine's best, the ratios each round's and their median")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    args = p.parse_args()
    from refllama.api import default_model_path

    N_DECODE = args.decode
    path = args.model or default_model_path()
    if args.child:
        return child(args.child, path, args.threads, json.loads(args.ids), args.repeat, args.cpu_path)
    cfg, name, size_mb = describe(path)
    ids = json.dumps(prompt_ids(path, args.prompt))
    rounds, busy = [], {}  # rounds: each round's {engine: result}
    engines = [e for e in args.engines.split(",") if installed(e) and not (e == "llama.cpp" and os.path.isdir(path))]
    for engine in sorted(set(args.engines.split(",")) - set(engines)):
        print(f"{engine}: not installed or not for this model, skipped", file=sys.stderr)
    for _ in range(args.rounds):
        rounds.append({})
        for engine in engines:
            command = [sys.executable, __file__, "--child", engine, "-m", path, "--threads", str(args.threads),
                       "--ids", ids, "--repeat", str(args.repeat), "--decode", str(N_DECODE)] + (
                       ["--cpu-path", args.cpu_path] if args.cpu_path else [])
            for runs, burner in ((rounds[-1], False), (busy, True))[:1 + args.busy]:
                r = run_child(command, burner)
                if r.returncode != 0:
                    print(f"{engine}: failed{' (busy)' if burner else ''}\n{r.stderr[-2000:]}", file=sys.stderr)
                    break
                runs[engine] = json.loads(r.stdout.strip().splitlines()[-1])
    rows = {e: best([rd[e] for rd in rounds if e in rd]) for e in engines if any(e in rd for rd in rounds)}
    bandwidth = memory_bandwidth(args.threads or os.cpu_count())
    numba_cpu = " ".join(os.environ.get(v, "") for v in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")).strip()
    print(f"{name} ({os.path.basename(path.rstrip('/'))}, {size_mb:.0f} MB), {cpu_name()}, {os.cpu_count()} cores, "
          f"{args.prompt}-token prompt, {N_DECODE} decoded tokens, best of {args.repeat}"
          + (f" in each of {args.rounds} rounds" if args.rounds > 1 else "")
          + (f", Numba compiling for {numba_cpu}" if numba_cpu else "")
          + f"; memory bandwidth {bandwidth / 1e9:.1f} GB/s: reading the weights once takes "
          f"{size_mb * 2**20 / bandwidth:.2f} s, at most {bandwidth / (size_mb * 2**20):.1f} tok/s of decode\n")
    print("| engine | threads | CPU path | load (s) | prefill (tok/s) | decode (tok/s) | peak RSS (MB) "
          "| anon / file (MB) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for e, r in rows.items():
        print(f"| {e} | {r.get('threads', '')} | {r.get('cpu_path') or ''} | {r['load_s']:.2f} | "
              f"{r['prefill_tok_s']:.1f} | {r['decode_tok_s']:.1f} | {r['peak_rss_mb']:.0f} | "
              f"{r['anon_mb']:.0f} / {r['file_mb']:.0f} |")
    if busy:
        print("\nOne core kept busy by another process: the same runs, and the share of the quiet speed each keeps\n")
        print("| engine | threads (at the end) | prefill (tok/s) | kept | decode (tok/s) | kept |")
        print("| --- | --- | --- | --- | --- | --- |")
        for e, r in busy.items():
            q = rows[e]
            print(f"| {e} | {r.get('threads', '')} | {r['prefill_tok_s']:.1f} | "
                  f"{r['prefill_tok_s'] / q['prefill_tok_s']:.2f}x | {r['decode_tok_s']:.1f} | "
                  f"{r['decode_tok_s'] / q['decode_tok_s']:.2f}x |")

    def ratio(a, b, key):
        each = [rd[a][key] / rd[b][key] for rd in rounds if a in rd and b in rd]
        if len(each) == 1:
            print(f"- {a} / {b} {key.split('_')[0]}: {each[0]:.2f}x")
        elif each:
            print(f"- {a} / {b} {key.split('_')[0]}: {statistics.median(each):.2f}x, the median of the rounds' "
                  + ", ".join(f"{v:.2f}x" for v in each))
    print()
    for mine in ("numpy", "numba", "numba-ggml"):
        for peer in ("llama.cpp", "transformers"):
            ratio(mine, peer, "decode_tok_s")
            ratio(mine, peer, "prefill_tok_s")
    kv_mb = (args.prompt + N_DECODE) * cfg.n_layer * 2 * cfg.n_head_kv * cfg.head_dim * 4 / 2**20
    for e, r in rows.items():
        print(f"- {e} peak RSS / (file + KV cache {kv_mb:.0f} MB): {r['peak_rss_mb'] / (size_mb + kv_mb):.2f}x")


def best(runs):  # one engine's rounds -> one row: its fastest prefill and decode, its largest memory
    row = dict(runs[0])
    for key in ("prefill_tok_s", "decode_tok_s"):
        row[key] = max(r[key] for r in runs)
    for key in ("peak_rss_mb", "anon_mb", "file_mb"):
        row[key] = max(r[key] for r in runs)
    row["load_s"] = min(r["load_s"] for r in runs)
    return row


def run_child(command, burner):
    """One engine's process; with `burner`, beside another that keeps a core busy from a second before it starts."""
    if not burner:
        return subprocess.run(command, capture_output=True, text=True)
    loop = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.0)
        return subprocess.run(command, capture_output=True, text=True)
    finally:
        loop.kill()
        loop.wait()


def cpu_name():
    """This CPU's model name (/proc/cpuinfo), for the table's heading."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        import platform

        return platform.processor() or platform.machine()


def describe(path):
    """(config, name, size in MB) of a GGUF file or an HF directory."""
    from refllama import arch

    if os.path.isdir(path):
        from refllama.formats.hf_loader import Config

        c = Config(os.path.join(path, "config.json"))
        cfg = arch.for_hf(c.get("architectures", kind=(list,))[0], c.path).config_from_hf(c)[0]
        size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors"))
        card = os.path.join(path, "README.md")  # a model card's title, e.g. a synthetic model's
        title = open(card, encoding="utf-8").readline() if os.path.exists(card) else ""
        return cfg, title[2:].strip() if title.startswith("# ") else os.path.basename(path.rstrip("/")), size / 2**20
    from refllama.formats.gguf_loader import GGUFFile

    g = GGUFFile(path)
    cfg = arch.for_gguf(g.string("general.architecture", required=True), path).config_from_gguf(g)
    return cfg, g.string("general.name", os.path.basename(path)), os.path.getsize(path) / 2**20


if __name__ == "__main__":
    main()
