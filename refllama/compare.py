"""Compare two checkpoint dumps stage by stage and name the first stage, in forward order, that adds error.

    python -m refllama.compare MINE REF [-m MODEL] [--numerics bfloat16] [--json] [--plot errors.png]
    python -m refllama.compare --logits MINE REF

MINE is the dump checked, REF the reference: directories or .safetensors files in the format of
checkpoints/FORMAT.md, of the same token ids. Per stage: the error end to end (MINE against REF) beside the
error of the stage before it, and, when the model is at hand, each side's local error: refllama re-runs the
stage on that side's own inputs, so a stage that adds error is told apart from one that only carries it.
Exit code 0: every stage within tolerance; 1: a stage diverged; 2: the comparison could not be made (an input
unreadable, MINE's stage names mostly unknown, a stage of --require-stages not compared).
"""

import json
import os
import sys

import numpy as np

from . import api
from .check.compare import COLUMNS, compare
from .check.dump import PRODUCER_NUMERICS, Dump, model_sha256
from .check.logits import exit_code, logits_verdict, print_logits
from .check.metrics import spans
from .cli import parser
from .errors import RefllamaError
from .numerics.cpu_paths import EMULATED


def find_model(path, mine, ref, numerics=None, backend="numba"):
    """The model both dumps ran (its sha256 is the one they record): `path`, else a `model_path` they give, else
    the installed SmolLM2. None, with the reason, when none is found. It re-runs stages in numerics "ggml" when
    both dumps compute llama.cpp's arithmetic (MINE's as `numerics` says, if given; repacked or not, and on the
    CPU path, as REF's manifest says, where refllama reproduces that path), else in float32; on `backend`
    (numba: its kernels, the same arithmetic in its own order of float32 sums, far inside every local tolerance,
    and fast at 8B; numpy: the readable forward)."""
    want = {str(d.manifest.get("model_sha256") or "") for d in (ref, mine)} - {""}
    candidates = [path] if path else [d.manifest.get("model_path") for d in (ref, mine)]
    if not path:
        try:
            candidates.append(api.default_model_path())
        except RefllamaError:
            pass
    for c in dict.fromkeys(c for c in candidates if c and os.path.exists(c)):
        if path or not want or model_sha256(c) in want:
            n_ctx = max(len(ref.token_ids), len(mine.token_ids), 256, int(ref.manifest.get("n_ctx") or 0))
            both_ggml = (numerics or mine.numerics) == ref.numerics == "ggml" and not os.path.isdir(c)
            cpu = ref.cpu_path if both_ggml and ref.cpu_path in EMULATED[backend] else None  # REF's, if reproduced
            return api.load(c, backend=backend, n_ctx=n_ctx, numerics="ggml" if both_ggml else "float32",
                            repack=ref.repack, cpu_path=cpu), None
    return None, "no model with the dumps' sha256 found (give -m MODEL)"

def plot(rows, path, first=None):
    """Layer x stage heatmap of log10(max_rel), on one fixed colour scale, gaps marked between layers not
    adjacent, the first divergence circled; the picture to look at first."""
    try:
        import matplotlib
    except ImportError:
        raise RefllamaError("--plot needs matplotlib: pip install 'refllama[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = list(dict.fromkeys(r["stage"] for r in rows))
    layers = sorted({r["layer"] for r in rows if r["layer"] is not None})
    labels, index = ["model"], {None: 0}
    for n in layers:
        if labels[-1] != "model" and n != int(labels[-1]) + 1:
            labels.append("...")
        index[n] = len(labels)
        labels.append(str(n))
    grid = np.full((len(labels), len(stages)), np.nan)
    for r in rows:
        grid[index[r["layer"]], stages.index(r["stage"])] = np.log10(max(r["max_rel"], 1e-8))
    fig, ax = plt.subplots(figsize=(2 + 0.45 * len(stages), 2 + 0.28 * len(labels)))
    im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=-8, vmax=0)
    ax.set_xticks(range(len(stages)), stages, rotation=60, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("stage")
    ax.set_ylabel("layer ('...': layers not compared)")
    for r in rows:
        x, y = stages.index(r["stage"]), index[r["layer"]]
        if not r["ok"]:
            ax.add_patch(plt.Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
        if first is not None and r["name"] == first["name"]:
            ax.plot(x, y, marker="*", color="white", markersize=14, markeredgecolor="black")
    fig.colorbar(im, ax=ax, label="log10(max abs error / reference range)")
    ax.set_title("error per stage (red box: the stage adds error, or is past tolerance where it was not re-run; "
                 "star: first divergence"
                 + (f", {first['name']})" if first else ")"))
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return labels


def divergence_line(f):
    wrong = f.get("wrong_positions") or f["positions"]  # those past tolerance on their own, else all compared
    where = spans(wrong) + (f" of {spans(f['positions'])}" if wrong != f["positions"] else "")
    return (f"first divergence: {f['name']} (max_rel {f['max_rel']:.3e}, nmse {f['nmse']:.3e}"
            + (f"; {f['bits_differ']} values differ in their bits" if f.get("bits_differ") else "")
            + (f"; added by {' and '.join(f['adds'])}" if f["adds"] else "") + f"; positions {where})"
            + (f"; {entered_line(f)}" if "entered" in f else ""))


def entered_line(f):
    """Where error that no compared stage adds came in: between the last stage within tolerance and this one."""
    e = f["entered"]
    span = f"between {e['after']} and {f['name']}" if e["after"] else f"before {f['name']}"
    if not e["only"]:
        return (f"the error entered {span}, where neither dump holds a stage: each side's re-run of {f['name']} is "
                "within tolerance, so a step before it that both skip dumping differs")
    return f"the error entered {span}, in stages " + "; ".join(
        ("both hold but neither aligns (no ffn_moe_topk): " if side == "unaligned" else f"only {side} holds: ")
        + ", ".join(a if a == b else f"{a} .. {b}" for a, b in runs) for side, runs in e["only"].items())


SHOWN = 5  # the later stages that add error of their own a short report lists after the first divergence


def print_report(rep, full):
    """The verdict first; then the first divergence's row and the next stages that add error of their own (every
    stage with `full`), what the rest after it do, the coverage, where the first divergence sits and the hints; the
    verdict again as the last line. A failing report fits a screen."""
    col, first = rep.column, rep.first
    print(divergence_line(first) if first else f"all {len(rep.rows)} stages within tolerance")
    print(f"tolerance: {col.name} ({col.why})")
    for note in rep.notes:
        print(f"note: {note}")
    after = rep.rows[rep.rows.index(first) + 1:] if first else []
    own = [r for r in after if r["adds"]]  # independent divergences: each adds error on its side's own inputs
    shown = rep.rows if full else ([first] + own[:SHOWN] if first else [])
    if shown:
        print(f"{'stage':<18} {'max_rel':>9} {'nmse':>9} {'input':>9} {'MINE':>9} {'REF':>9}  verdict")
        print(f"{'':<18} {'(end to end)':>19} {'nmse':>9} {'local':>9} {'local':>9}")
    for r in shown:
        local = [f"{r[f'local_{s}']['nmse']:9.2e}" if f"local_{s}" in r else f"{'-':>9}" for s in ("MINE", "REF")]
        inp = f"{r['input_nmse']:9.2e}" if r["input_nmse"] is not None else f"{'-':>9}"
        verdict = ("adds error (" + ", ".join(r["adds"]) + ")" if r["adds"] else
                   "FAIL" if not r["ok"] else "entered before it" if "entered" in r else
                   "carried from its inputs" if r["carried"] else "ok")
        pos = r["positions"]
        at = f" @{pos[0]}" if len(pos) == 1 else ""
        print(f"{r['name'] + at:<18} {r['max_rel']:9.2e} {r['nmse']:9.2e} {inp} {local[0]} {local[1]}  {verdict}")
    if first and not full:
        counts = {"add error of their own": len(own),
                  "carry its error": sum(r["carried"] for r in after),
                  "are past tolerance, not re-run": sum(not r["ok"] and not r["adds"] for r in after),
                  "are within tolerance": sum(r["ok"] and not r["carried"] for r in after)}
        print(f"after it, of {len(after)} stages: " + ", ".join(f"{n} {what}" for what, n in counts.items() if n)
              + (" (--full lists every stage)" if after else ""))
    print("\n".join(rep.coverage))
    if first is None:
        print(f"all {len(rep.rows)} stages within tolerance")
        return 0
    print("\n".join(rep.where + rep.hints))
    print(divergence_line(first))
    return 1


def as_json(rep):
    keep = ("name", "stage", "layer", "positions", "max_abs", "max_rel", "nmse", "cosine", "tol", "local_tol",
            "input_nmse", "local_MINE", "local_REF", "adds", "ok", "carried", "verdict", "wrong_positions", "entered",
            "bits_differ")
    return {"tolerance": rep.column._asdict(), "notes": rep.notes, "coverage": rep.coverage,
            "rows": [{k: r[k] for k in keep if k in r} for r in rep.rows],
            "first_divergence": rep.first["name"] if rep.first else None, "where": rep.where, "hints": rep.hints,
            "hinted": rep.hinted}


def main(argv=None):
    p = parser("refllama.compare", __doc__)
    p.add_argument("mine", help="the dump checked (directory or .safetensors; with --logits also an .npy [T, V])")
    p.add_argument("ref", help="the reference dump")
    p.add_argument("-m", "--model", help="the model both ran, to re-run stages on each side's inputs (default: "
                   "the one the dumps name, or the installed SmolLM2, if its sha256 matches)")
    p.add_argument("--no-rerun", action="store_true", help="compare end to end only, without loading a model")
    p.add_argument("--backend", choices=("numba", "numpy"), default="numba",
                   help="what re-runs the stages: numba's kernels (fast at any size) or the readable NumPy forward "
                   "(default %(default)s)")
    p.add_argument("--numerics", choices=PRODUCER_NUMERICS,
                   help="what MINE computes in (default: its manifest's 'numerics', else float32)")
    p.add_argument("--tolerance", choices=COLUMNS, help="tolerance column (default: chosen from both dumps)")
    p.add_argument("--logits", action="store_true", help="judge the whole text by its logits: KL divergence, top-1 "
                   "agreement, perplexities")
    p.add_argument("--require-stages", metavar="NAMES", default="",
                   help="comma-separated stages that must be compared, else exit 2 (a CI's demand): attn_norm-3 as "
                   "named, attn_norm in every layer compared")
    p.add_argument("--plot", help="write a layer x stage heatmap of the error to this PNG")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--full", "--all", dest="full", action="store_true",
                   help="print every stage (default: the first divergence and the next stages that add error)")
    args = p.parse_args(argv)
    np.seterr(all="ignore")
    try:
        if args.logits:
            v = logits_verdict(args.mine, args.ref, args.numerics)
            if args.json:
                print(json.dumps(v, indent=1))
                return exit_code(v)
            return print_logits(v)
        mine, ref = Dump(args.mine), Dump(args.ref)
        model, why = (None, "--no-rerun") if args.no_rerun else \
            find_model(args.model, mine, ref, args.numerics, args.backend)
        rep = compare(args.mine, args.ref, model, args.tolerance, args.numerics,
                      [n for n in args.require_stages.split(",") if n])
        if model is None:
            rep.notes.append(f"stages not re-run ({why}): verdicts are end to end only")
        if args.plot:
            plot(rep.rows, args.plot, rep.first)
    except RefllamaError as e:
        print(f"refllama.compare: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(as_json(rep), indent=1))
        return 0 if rep.first is None else 1
    code = print_report(rep, args.full)
    if args.plot:
        print(f"plot written to {args.plot}")
    return code


if __name__ == "__main__":
    sys.exit(main())
