"""The GPU check: one command, a few minutes, on a bare GPU machine with nothing but the source tree (and the wheels
of `../shared/gpu/slim.sh wheels`). It makes the synthetic models it needs there (random weights, transformers'
own initialisation, real shapes: SmolLM2-135M's and Llama-3.1-8B's), then:

1. runs the GPU tests (tests/test_gpu.py) and the checkpoint suite's cupy cases (`pytest checkpoints --backend
   cupy -k cupy`: the tiny families' F32 references; SmolLM2's need its wheel, absent there);
2. times prefill and decode for refllama cupy (decode as one CUDA graph; SmolLM2 also without it), transformers
   float32 and bfloat16 eager, on the same GPU, with the decode's bandwidth bound (the weights read once a token at
   the copy bandwidth measured here) and each engine's peak GPU memory;
3. compares refllama cupy with transformers float32 stage by stage (every stage of a 16-token prompt, refllama's
   trace against transformers' hooks, tools/dump_hf.py), at both shapes;
4. times a Q4_K_M GGUF at Llama-3.1-8B's shapes (tools/make_synthetic_model.py) with its blocks kept on the GPU and
   widened to float32, comparing the two stage by stage, and a Qwen2.5-32B-shaped model in bfloat16 made on the
   device (65 GB: what fits one 80 GB GPU).

It prints one table and writes it, with every figure and error, to OUT/gpu_check.md and OUT/gpu_check.json as each
part ends, so a run cut short still leaves what it measured. A part that fails is recorded and the next runs.

    python tools/gpu_check.py -o OUT [--shapes smollm2-135m,llama-3.1-8b,llama-3.1-8b-q4_k_m,qwen2.5-32b]
        [--skip-tests]
"""

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]

SHAPES = {  # transformers LlamaConfig fields of each synthetic model; "dtype": the weights as saved
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0,
                         max_position_embeddings=8192, dtype="float32"),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0,
                         max_position_embeddings=131072, dtype="bfloat16"),
}
PARTS = (*SHAPES, "llama-3.1-8b-q4_k_m", "qwen2.5-32b")  # and a GGUF at 8B's shapes, a 32B made on the device
PROMPT, DECODE, STAGE_PROMPT, N_CTX = 128, 32, 16, 1024
DEVICE = "cuda"  # where transformers makes the models
TARGETS = ("SmolLM2 decode >= 3x transformers float32 eager, prefill >= 1.0x; 8B decode >= 70 tok/s (float32 "
           "weights), >= 120 tok/s (bfloat16); peak GPU memory <= weights + KV cache + 1 GiB; every stage within "
           "1e-5 of transformers float32")


class Report:
    """What the check found so far, written out after every part."""

    def __init__(self, out):
        self.out, self.rows, self.parts, self.stages, self.info = Path(out), [], {}, {}, {}
        self.out.mkdir(parents=True, exist_ok=True)

    def part(self, name, fn, *args):
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            result = fn(*args)
            self.parts[name] = {"ok": True, "s": round(time.perf_counter() - t0, 1), **(result or {})}
        except Exception as e:  # recorded, and the next part runs: one GPU run must say as much as it can
            traceback.print_exc()
            self.parts[name] = {"ok": False, "s": round(time.perf_counter() - t0, 1),
                                "error": f"{type(e).__name__}: {e}"[:2000]}
        print(f"   {name}: {'ok' if self.parts[name]['ok'] else 'FAILED'} ({self.parts[name]['s']} s)", flush=True)
        self.write()

    def table(self):
        lines = [f"# GPU check ({self.info.get('gpu', '?')}; synthetic weights; {time.strftime('%Y-%m-%d')})", "",
                 f"Targets: {TARGETS}.", "",
                 "| model (synthetic) | engine | weights | prefill tok/s | decode tok/s | decode bound tok/s | "
                 "peak GPU memory | weights + KV |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in self.rows:
            lines.append(f"| {r['model']} | {r['engine']} | {r['weights']} | {r['prefill']:.0f} | {r['decode']:.1f} "
                         f"| {r.get('bound', float('nan')):.0f} | {gib(r.get('peak'))} | {gib(r.get('budget'))} |")
        lines += ["", "| stage comparison | stages | worst max_rel | at |",
                  "| --- | --- | --- | --- |"]
        for k, s in self.stages.items():
            lines.append(f"| {k} | {s['n']} | {s['worst']:.2e} | {s['at']} |")
        lines += ["", "| part | result | seconds |", "| --- | --- | --- |"]
        for k, p in self.parts.items():
            lines.append(f"| {k} | {'ok' if p['ok'] else 'FAILED: ' + p['error'].splitlines()[0][:200]} "
                         f"{p.get('summary', '')} | {p['s']} |")
        return "\n".join(lines) + "\n"

    def write(self):
        (self.out / "gpu_check.json").write_text(json.dumps(
            {"info": self.info, "rows": self.rows, "stages": self.stages, "parts": self.parts}, indent=1))
        (self.out / "gpu_check.md").write_text(self.table())


def gib(n):
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def machine(report):
    import cupy
    import torch
    import transformers

    props = cupy.cuda.runtime.getDeviceProperties(0)
    report.info.update(gpu=props["name"].decode(), cupy=cupy.__version__, torch=torch.__version__,
                       transformers=transformers.__version__, numpy=np.__version__)
    a = cupy.empty(1 << 28, cupy.float32)  # 1 GiB: copied, read and written
    b = cupy.empty_like(a)
    b[...] = a
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        b[...] = a
    cupy.cuda.Device().synchronize()
    report.info["copy_GBps"] = round(2 * a.nbytes * 10 / (time.perf_counter() - t0) / 1e9)
    del a, b
    cupy.get_default_memory_pool().free_all_blocks()
    return {"summary": f"{report.info['gpu']}, copy {report.info['copy_GBps']} GB/s"}


def tests():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = {}
    for name, cmd, limit in (("tests/test_gpu.py", ["tests/test_gpu.py"], 180),
                             ("checkpoints --backend cupy", ["checkpoints", "--backend", "cupy", "-k", "cupy"], 240)):
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=line", "--full",
                            *cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
        tail = (r.stdout + r.stderr).strip().splitlines()[-25:]
        print("\n".join(tail), flush=True)
        out[name] = tail[-1] if tail else "?"
        if r.returncode != 0:
            raise RuntimeError(f"{name}: " + " / ".join(tail[-8:]))
    return {"summary": "; ".join(f"{k}: {v}" for k, v in out.items())}


def make_model(name, directory):
    """The synthetic model of SHAPES[name] made by transformers on the GPU and saved to `directory`; returns it."""
    import torch
    import transformers

    fields = dict(SHAPES[name])
    dtype = getattr(torch, fields.pop("dtype"))
    cfg = transformers.LlamaConfig(**fields, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    torch.set_default_dtype(dtype)
    try:
        with torch.device(DEVICE):
            hf = transformers.LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    hf.set_attn_implementation("eager")
    hf.save_pretrained(directory)
    return hf


class PeakMemory:
    """CuPy's pool with its high-water mark of bytes in use: every allocation refllama makes goes through it."""

    def __init__(self):
        import cupy

        self.cupy, self.pool, self.peak = cupy, cupy.get_default_memory_pool(), 0
        cupy.cuda.set_allocator(self.malloc)

    def malloc(self, n):
        p = self.pool.malloc(n)
        self.peak = max(self.peak, self.pool.used_bytes())
        return p

    def reset(self):
        self.pool.free_all_blocks()
        self.peak = self.pool.used_bytes()


def hf_speed(hf, ids, n_decode):  # -> prefill tok/s, decode tok/s, peak bytes
    import torch

    x = torch.tensor([ids], device="cuda")
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        for _ in range(2):
            hf(x, use_cache=True)
        torch.cuda.synchronize()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            hf(x, use_cache=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        for _ in range(2):  # the first decode warms up
            out = hf(x, use_cache=True)
            past, tok = out.past_key_values, int(out.logits[0, -1].argmax())
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n_decode):
                out = hf(torch.tensor([[tok]], device="cuda"), past_key_values=past, use_cache=True)
                past, tok = out.past_key_values, int(out.logits[0, -1].argmax())  # greedy, as generate()
            dt = time.perf_counter() - t0
    return len(ids) / min(times), n_decode / dt, torch.cuda.max_memory_allocated()


def refllama_speed(m, ids, n_decode, peak):  # -> prefill tok/s, decode tok/s, peak bytes (after the load)
    import cupy

    from refllama.xp import to_numpy

    def prefill():
        m.cache.reset()
        logits = m.forward(ids, 0, last_only=True)
        cupy.cuda.Device().synchronize()
        return logits

    prefill()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        prefill()
        times.append(time.perf_counter() - t0)
    for _ in range(2):  # the first decode captures the graph
        tok = int(to_numpy(prefill()[-1]).argmax())
        t0 = time.perf_counter()
        for k in range(n_decode):
            tok = int(to_numpy(m.forward([tok], len(ids) + k)[-1]).argmax())
        dt = time.perf_counter() - t0
    return len(ids) / min(times), n_decode / dt, peak.peak


def nbytes(w):
    return getattr(w, "nbytes", 0)  # arrays and GpuMatrix


def weight_bytes(m):  # -> (bytes of every weight, bytes a decode step reads: all but an untied embedding)
    """Before the first decode step, which joins a layer's matrices into views of one."""
    weights = [w for k, w in m.weights.items() if k != "layers"] + [w for lw in m.weights["layers"]
                                                                      for w in lw.values()]
    total = sum(nbytes(w) for w in {id(w): w for w in weights}.values())
    return total, total - (0 if m.config.tied_output else nbytes(m.weights["token_embd"]))


def worst_stage(got, want):  # -> (stages compared, worst max_rel, its stage): two stage dicts, in NumPy
    from refllama.check.metrics import metrics

    errs = {k: metrics(got[k], v)["max_rel"] for k, v in want.items() if k in got and got[k].shape == v.shape}
    at = max(errs, key=errs.get)
    return {"n": len(errs), "worst": errs[at], "at": at}


def refllama_stages(m, ids):  # -> refllama's stages of a prompt, q/k in transformers' pair layout
    import refllama

    with refllama.trace(m, qk_layout="half") as t:
        m.logits(ids)
    return dict(t)


def add_row(report, model, engine, weights, prefill, decode, mem, extra=None):
    r = {"model": model, "engine": engine, "weights": weights, "prefill": prefill, "decode": decode, "peak": mem,
         **(extra or {})}
    report.rows.append(r)
    print(f"   {engine} {weights}: prefill {prefill:.0f} tok/s, decode {decode:.1f} tok/s, peak {gib(mem)}", flush=True)


def timed_row(report, model, weights, m, ids, peak, load_s):  # refllama's speed and memory against its budget
    total, read = weight_bytes(m)
    kv = sum(a.nbytes for a in m.cache.k + m.cache.v)
    extra = {"bound": report.info.get("copy_GBps", 0) * 1e9 / read, "budget": total + kv + 2**30,
             "load_s": round(load_s, 1)}
    add_row(report, model, "refllama cupy", weights, *refllama_speed(m, ids, DECODE, peak), extra)


def gguf_check(report, work, peak):
    """Llama-3.1-8B's shapes as a Q4_K_M GGUF (tools/make_synthetic_model.py, a synthetic vocabulary): refllama cupy
    with the blocks kept on the device, and with them widened to float32 at load, timed; their stages compared (the
    same values multiplied, so float32's noise only)."""
    import make_synthetic_model

    import refllama

    name, V = "llama-3.1-8b", SHAPES["llama-3.1-8b"]["vocab_size"]
    path = make_synthetic_model.write(name, "q4_k_m", work, n_vocab=V)
    ids = np.random.default_rng(0).integers(1, V, PROMPT).tolist()
    stages = {}
    for in_file, kind in ((None, "Q4_K_M kept"), (False, "float32")):
        peak.reset()
        t0 = time.perf_counter()
        m = refllama.load(path, backend="cupy", n_ctx=N_CTX, weights_in_file=in_file)
        timed_row(report, f"{name} GGUF", kind, m, ids, peak, time.perf_counter() - t0)
        stages[kind] = refllama_stages(m, ids[:STAGE_PROMPT])
        del m
        peak.reset()
    w = report.stages[f"{name} GGUF: refllama cupy Q4_K_M kept vs float32"] = worst_stage(*stages.values())
    os.remove(path)
    return {"summary": f"Q4_K_M kept vs widened to float32: {w['n']} stages, worst {w['worst']:.2e} at {w['at']}"}


def device_check(report, name, peak):
    """A model too big to write in the check's minutes (Qwen2.5-32B's shapes: 65 GB of bfloat16), made on the
    device: its tensors as the synthetic GGUF would hold them (make_synthetic_model.plan), bfloat16 matrices kept
    16-bit (GpuMatrix). Shows what fits one GPU and its speed; no reference holds it in float32 there."""
    import cupy
    import make_synthetic_model

    from refllama import arch as archs
    from refllama.api import Model
    from refllama.arch.tables import read_weights
    from refllama.numerics.gpu import GpuMatrix, Scratch
    from refllama.xp import Placement

    V = 152064
    cfg, tensors = make_synthetic_model.plan(name, "bf16", make_synthetic_model.SHAPES[name]["n_layer"], V)
    plan = {n: (s, role == "norm") for n, s, _, role in tensors}
    scratch, rng = Scratch(cupy), cupy.random.default_rng(0)
    temporary = cupy.cuda.MemoryPool()  # the random float32 values' own, so that no weight is placed in the holes
    # they leave (the pool splits a free block for a smaller array: 16 GiB lost that way at 32B)

    def make(n, shape):
        s, is_norm = plan[n]
        if len(s) == 1:
            return (1.0 if is_norm else 0.0) + make_synthetic_model.SPREAD * rng.standard_normal(s, cupy.float32)
        bits = cupy.empty(s, cupy.uint16)
        with cupy.cuda.using_allocator(temporary.malloc):
            for a in range(0, s[0], 4096):  # rows at a time: a float32 temporary of at most 4096 rows
                x = make_synthetic_model.SPREAD * rng.standard_normal((min(4096, s[0] - a), s[1]), cupy.float32)
                bits[a:a + len(x)] = (x.view(cupy.uint32) >> 16).astype(cupy.uint16)
                del x
        temporary.free_all_blocks()
        return GpuMatrix(bits, "bf16", scratch)

    gc.collect()
    peak.reset()
    t0 = time.perf_counter()
    class Made(Placement):  # the tensors as `make` made them on the device
        def __call__(self, a):
            return a

    weights = read_weights(archs.get(cfg.arch), cfg, "gguf", make, plan.__contains__, Made(cupy))
    m = Model(f"synthetic {name} (made on the device)", cfg, weights, None, None, "cupy", cupy, N_CTX)
    peak.reset()
    print(f"   weights made: {gib(peak.pool.used_bytes())} in use, {gib(peak.pool.total_bytes())} held", flush=True)
    ids = np.random.default_rng(0).integers(1, V, PROMPT).tolist()
    timed_row(report, name, "16-bit kept", m, ids, peak, time.perf_counter() - t0)
    r = report.rows[-1]
    del m, weights
    peak.reset()
    return {"summary": f"{gib(r['peak'])} at most on the GPU (weights + KV + 1 GiB: {gib(r['budget'])}), decode "
                       f"{r['decode']:.1f} tok/s"}


def shape_check(report, name, directory, peak):
    """One synthetic shape: transformers bfloat16 and float32 timed and traced, then refllama cupy from the saved
    directory, its 16-bit weights kept (and, at 8B, widened to float32 at load), timed and compared."""
    import cupy
    import dump_hf
    import torch

    import refllama

    rng = np.random.default_rng(0)
    V = SHAPES[name]["vocab_size"]
    ids = rng.integers(1, V, PROMPT).tolist()
    stage_ids = ids[:STAGE_PROMPT]
    hf = make_model(name, directory)

    def row(*args):
        add_row(report, name, *args)

    for dtype in (torch.float32, torch.bfloat16):  # float32 first: .to(bfloat16) also rounds RoPE's inv_freq buffer
        hf = hf.to(dtype)
        torch.cuda.empty_cache()
        row("transformers eager", str(dtype).split(".")[1], *hf_speed(hf, ids, DECODE))
        if dtype == torch.float32:  # the stage reference, and transformers on the CPU: float32's noise between the two
            want = dump_hf.capture(hf, stage_ids)[0]
            want_cpu = dump_hf.capture(hf.to("cpu"), stage_ids)[0]
            hf = hf.to("cuda")
            report.stages[f"{name}: transformers float32, GPU vs CPU"] = worst_stage(want, want_cpu)
    del hf
    torch.cuda.empty_cache()
    results = {}
    for in_file in ((None, False) if name != "smollm2-135m" else (None,)):
        peak.reset()
        t0 = time.perf_counter()
        m = refllama.load(directory, backend="cupy", n_ctx=N_CTX, weights_in_file=in_file)
        kind = "16-bit kept" if in_file is None and SHAPES[name]["dtype"] != "float32" else "float32"
        timed_row(report, name, kind, m, ids, peak, time.perf_counter() - t0)
        if name == "smollm2-135m":
            m.graph = False
            extra = {k: report.rows[-1][k] for k in ("bound", "budget", "load_s")}
            row("refllama cupy, no graph", kind, *refllama_speed(m, ids, DECODE, peak), extra)
            m.graph = True
        got = refllama_stages(m, stage_ids)
        for ref, stages in (("transformers float32 GPU", want), ("transformers float32 CPU", want_cpu)):
            w = report.stages[f"{name}: refllama cupy {kind} vs {ref}"] = worst_stage(got, stages)
            results[kind, ref] = f"{kind} vs {ref}: {w['n']} stages, worst {w['worst']:.2e} at {w['at']}"
        del m
        peak.reset()
    cupy.get_default_memory_pool().free_all_blocks()
    return {"summary": "; ".join(results.values())}


def work_dir():
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and shutil.disk_usage(shm).free > 40e9 else None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--out", required=True, help="folder for gpu_check.md and gpu_check.json")
    p.add_argument("--shapes", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--skip-tests", action="store_true", help="the models only")
    p.add_argument("--work", default=work_dir(), help="where the synthetic models are written (default: /dev/shm, "
                   "in memory, where it has room for the 8B's 16 GB, else the temporary folder)")
    args = p.parse_args(argv)
    report = Report(args.out)
    report.part("machine", machine, report)
    if not args.skip_tests:
        report.part("tests", tests)
    peak = PeakMemory()
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        for name in args.shapes.split(","):
            if name in SHAPES:
                report.part(name, shape_check, report, name, os.path.join(work, name), peak)
                shutil.rmtree(os.path.join(work, name), ignore_errors=True)
            elif name == "llama-3.1-8b-q4_k_m":
                report.part(name, gguf_check, report, work, peak)
            else:
                report.part(name, device_check, report, name, peak)
    print(report.table())
    return 0 if all(p["ok"] for p in report.parts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
