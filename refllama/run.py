"""Command line: generate text with a model, streaming it as it comes.

    python -m refllama.run -p "The capital of France is" -n 32
"""

import argparse
import sys
import time

from .cli import SCRIPTS, add_gpu_layers, gpu_layers, parser
from .errors import RefllamaError
from .numerics import cpu_paths
from .xp import BACKENDS, NUMERICS, threads_notice


def layer_list(text):  # "0,-1" -> [0, -1]
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of block numbers: {text!r}") from None


def parse_args(argv):
    p = parser("refllama.run", __doc__, epilog="The other commands: " + ", ".join(
        f"{script} (python -m {module})" for module, script in SCRIPTS.items() if module != "refllama.run") + ".")
    p.add_argument("-m", "--model", help="GGUF file or HF directory (default: the installed SmolLM2-135M-Instruct)")
    p.add_argument("-p", "--prompt", help="prompt text")
    p.add_argument("-f", "--file", help="read the prompt from this file")
    p.add_argument("-n", "--n-predict", type=int, default=128,
                   help="tokens to generate; -1 = until an end token or the context's end (default 128; 0 with "
                        "--dump-dir: dump only)")
    p.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40, help="top-k, <= 0 disables (default 40)")
    p.add_argument("--top-p", type=float, default=0.95, help="top-p, 1.0 disables (default 0.95)")
    p.add_argument("--min-p", type=float, default=0.05, help="min-p, 0 disables (default 0.05)")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="repetition penalty, 1.0 disables (default 1.0)")
    p.add_argument("--repeat-last-n", type=int, default=64, help="penalty window; 0 disables, -1 = all (default 64)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--system", help="system message for --chat")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--backend", choices=BACKENDS, default="numpy", help="array backend (default numpy)")
    add_gpu_layers(p)
    p.add_argument("--numerics", choices=NUMERICS, default="float32",
                   help="float32 (default), or ggml: llama.cpp's CPU arithmetic on a GGUF (8-bit activations, f16 KV)")
    p.add_argument("--no-repack", action="store_true",
                   help="with --numerics ggml: as llama.cpp run with --no-repack (or built without GGML_CPU_REPACK): "
                        "Q4_K products by vec_dot, not x86's repacked gemv/gemm (docs/ggml-numerics.md)")
    p.add_argument("--cpu-path", choices=list(cpu_paths.PATHS), default=None,
                   help="with --numerics ggml: which of llama.cpp's CPU paths to reproduce (default: this host's; "
                        f"reproduced: {'; '.join(f'{b}: ' + ', '.join(p) for b, p in cpu_paths.EMULATED.items())})")
    p.add_argument("-t", "--threads", type=int, default=None,
                   help="CPU threads (BLAS, or Numba kernels with --backend numba); 0 = the idle cores, "
                        "followed as other work comes and goes (default, see README)")
    p.add_argument("--dump-dir", help="write every stage of the prompt's forward pass here (checkpoints/FORMAT.md)")
    p.add_argument("--decode-steps", type=int, default=0,
                   help="with --dump-dir: also dump N greedy decode steps, one token each, after the prefill")
    p.add_argument("--tokens-from", metavar="DUMP",
                   help="with --dump-dir: run another dump's token ids (its prompt, then its decode steps' tokens) "
                        "instead of tokenizing a prompt, so the two dumps compare")
    p.add_argument("--dump-layers", metavar="N,N,...", type=layer_list,
                   help="with --dump-dir: keep these blocks only (negative from the end; each one's input too)")
    p.add_argument("--dump-positions", metavar="N", type=int,
                   help="with --dump-dir: keep N token positions of a longer prompt per stage (the first 8 and the "
                        "last N - 8; K and V keep all, attention reads them)")
    p.add_argument("-c", "--ctx-size", type=int, default=4096,
                   help="context size in tokens; 0 = the model's (default 4096)")
    args = p.parse_args(argv)
    if args.prompt is not None and args.file is not None:
        p.error("give either -p/--prompt or -f/--file, not both")
    if (args.decode_steps or args.tokens_from or args.dump_layers or args.dump_positions) and not args.dump_dir:
        p.error("--decode-steps, --tokens-from, --dump-layers and --dump-positions go with --dump-dir")
    if args.dump_positions is not None and args.dump_positions < 9:
        p.error(f"--dump-positions must be at least 9 (the first 8 and the last ones), got {args.dump_positions}")
    if args.system is not None and not args.chat:
        p.error("--system goes with --chat (a plain prompt has no system message)")
    if args.no_repack and args.numerics != "ggml":
        p.error("--no-repack goes with --numerics ggml (it picks which of llama.cpp's x86 paths to reproduce)")
    if args.cpu_path and args.numerics != "ggml":
        p.error("--cpu-path goes with --numerics ggml (it picks which of llama.cpp's CPU paths to reproduce)")
    if args.n_predict < -1:
        p.error(f"-n/--n-predict must be -1 (until the end), 0 (with --dump-dir) or more, got {args.n_predict}")
    gpu_layers(args, p)
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        prompt = args.prompt
        if args.file is not None:
            try:
                with open(args.file, encoding="utf-8") as f:
                    prompt = f.read()
            except (OSError, UnicodeDecodeError) as e:
                raise RefllamaError(f"{args.file}: cannot read prompt file ({e})") from None
        if prompt is None:
            prompt = "Tell me a short story about a robot." if args.chat else "Once upon a time"
        run(args, prompt)
    except RefllamaError as e:
        print(f"refllama: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def run(args, prompt):
    from . import api
    from .xp import set_threads

    threads = set_threads(args.threads, args.backend)
    busy = threads_notice(args.threads)
    if busy:
        print(f"refllama: {busy}", file=sys.stderr)
    t0 = time.perf_counter()
    m = api.load(args.model, backend=args.backend, n_ctx=args.ctx_size, numerics=args.numerics,
                 repack=not args.no_repack, cpu_path=args.cpu_path)
    t_load = time.perf_counter() - t0
    if notice := api.past_training(m):
        print(f"refllama: {notice}", file=sys.stderr)
    if args.chat:
        system = [{"role": "system", "content": args.system}] if args.system else []
        messages = system + [{"role": "user", "content": prompt}]
        ids = m.chat_tokens(messages)
    elif not args.tokens_from:
        ids = m.tokenize(prompt)
    if args.dump_dir:
        decode_ids = None
        if args.tokens_from:
            from .check.dump import Dump

            other = Dump(args.tokens_from)
            ids, decode_ids = other.prompt_ids, other.decode_ids
            prompt = other.manifest.get("prompt")  # the ids are the other dump's: so is their text, if it gave one
        m.dump(ids, args.dump_dir, prompt=prompt, decode_steps=args.decode_steps, decode_ids=decode_ids,
               tokens_from=args.tokens_from, layers=args.dump_layers, max_rows=args.dump_positions)
        steps = len(decode_ids) if decode_ids is not None else args.decode_steps
        print(f"dumped the forward pass of {len(ids)} tokens and {steps} decode steps to {args.dump_dir}",
              file=sys.stderr)
        if args.n_predict == 0:  # the dump was the job
            return
    t_first = None
    t1 = time.perf_counter()
    n_predict = m.n_ctx - len(ids) if args.n_predict == -1 else args.n_predict
    tokens = m.generate(ids, max_tokens=n_predict, temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                        min_p=args.min_p, repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
                        seed=args.seed, stop=args.stop)
    if not args.chat and not args.tokens_from:
        sys.stdout.write(prompt)  # echoed once the prompt is known to fit and is prefilled, never before an error

    def timed(gen):  # gen's tokens, noting when the first came (its count is gen.n)
        nonlocal t_first
        for t in gen:
            t_first = t_first or time.perf_counter()
            yield t

    for piece in api.stream_text(m, timed(tokens), args.stop):
        sys.stdout.write(piece)
        sys.stdout.flush()
    t2 = time.perf_counter()
    sys.stdout.write("\n")
    n_gen = tokens.n
    t_prompt = (t_first or t2) - t1  # prefill and the first sample
    rate = f"{(n_gen - 1) / (t2 - t_first):.1f} tok/s" if n_gen > 1 else "n/a"
    following = "" if args.threads else ", following the idle cores"
    path = f", cpu path {m.cpu_path}{' --no-repack' if not m.repack else ''}" if m.cpu_path else ""
    print(f"\nload: {t_load:.2f} s ({m.backend}, numerics {m.numerics}{path}, threads={threads}{following}) | "
          f"prompt: {len(ids)} tokens, {len(ids) / t_prompt:.1f} tok/s"
          f" | generated: {n_gen} tokens, {rate} | stop: {tokens.finish_reason}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
