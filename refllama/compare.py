"""Compare two checkpoint dumps stage by stage and name the first stage, in forward order, past tolerance.

    python -m refllama.compare DIR_A DIR_B [--tol-table TABLE.md] [--plot errors.png]

DIR_B is the reference. Per stage and layer: max abs error, max abs error relative to the reference's
range, NMSE, cosine. Exit code 1 when a stage is past tolerance, 2 on bad input.
"""

import argparse
import re
import sys
from pathlib import Path

import numpy as np

from .dump import Dump, known_stages, split_name
from .errors import RefllamaError
from .tolerances import REFERENCE_KINDS, TOLERANCES


def read_tolerances(path):
    """{kind: {stage: (max_rel, nmse)}} from the markdown table whose header starts '| stage |'.

    Columns: stage, then max_rel and NMSE for each reference kind in REFERENCE_KINDS order, then why.
    """
    table = {kind: {} for kind in REFERENCE_KINDS}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise RefllamaError(f"{path}: cannot read tolerance table ({e})") from None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        n = 2 * len(REFERENCE_KINDS)
        m = re.fullmatch(r"`([A-Za-z_]+)`", cells[0]) if len(cells) > n else None
        if not m:
            continue
        try:
            numbers = [float(c) for c in cells[1:n + 1]]
        except ValueError:
            raise RefllamaError(f"{path}: tolerance row for '{m.group(1)}' has a non-number: {line.strip()}") from None
        for i, kind in enumerate(REFERENCE_KINDS):
            table[kind][m.group(1)] = (numbers[2 * i], numbers[2 * i + 1])
    if not any(table.values()):
        raise RefllamaError(f"{path}: no tolerance table found (rows like '| `attn_norm` | 1e-2 | ... |')")
    return table


def reference_kind(dump):
    producer = str(dump.manifest.get("producer", "")).lower()
    if "transformers" in producer:
        return "transformers"
    return "llama.cpp F32" if "f32 weights and kv cache" in producer else "llama.cpp"


def metrics(a, b):
    """Errors of a against the reference b (same shape)."""
    diff = a.astype(np.float64) - b.astype(np.float64)
    span = float(b.max() - b.min()) or float(np.abs(b).max()) or 1.0
    norm_b = float(np.sum(b.astype(np.float64) ** 2))
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    return {"max_abs": float(np.abs(diff).max()), "max_rel": float(np.abs(diff).max()) / span,
            "nmse": float(np.sum(diff ** 2)) / norm_b if norm_b else float(np.sum(diff ** 2)),
            "cosine": float(np.sum(a.astype(np.float64) * b)) / denom if denom else 1.0}


def aligned(da, db, name):
    """Both dumps' arrays for `name`, restricted to the token positions both kept."""
    pa, pb = da.positions(name), db.positions(name)
    common = sorted(set(pa) & set(pb))
    if not common:
        raise RefllamaError(f"stage '{name}': the dumps share no token positions")
    axis = da.token_axis(name)
    a = np.take(da[name], [pa.index(p) for p in common], axis=axis)
    b = np.take(db[name], [pb.index(p) for p in common], axis=axis)
    if a.shape != b.shape:
        raise RefllamaError(f"stage '{name}': shapes differ, {list(a.shape)} vs {list(b.shape)}")
    return a, b


def compare(dir_a, dir_b, tolerances, kind=None):
    """Rows of metrics for the stages both dumps hold, in forward order, and the first row past tolerance."""
    db = Dump(dir_b)
    da = Dump(dir_a, layout=db.layout)  # q/k of A in B's pair layout
    if da.manifest.get("token_ids") != db.manifest.get("token_ids"):
        raise RefllamaError("the dumps are of different token ids; compare runs of the same prompt")
    kind = kind or reference_kind(db)
    rows, first = [], None
    for name in [n for n in db.names if n in da]:
        stage, layer = split_name(name)
        row = {"name": name, "stage": stage, "layer": layer, **metrics(*aligned(da, db, name))}
        tol = tolerances[kind].get(stage)
        row["tol"] = tol
        row["ok"] = tol is None or (row["max_rel"] <= tol[0] and row["nmse"] <= tol[1])
        rows.append(row)
        if first is None and not row["ok"]:
            first = row
    return rows, first, kind


def coverage(dir_a, dir_b):
    """Lines for the summary: layers and stages compared, names in one dump only, names no architecture knows
    (with the closest known one, so a misspelling is seen)."""
    import difflib

    da, db = Dump(dir_a), Dump(dir_b)
    both = [n for n in db.names if n in da]
    layers = sorted({split_name(n)[1] for n in both} - {None})
    lines = [f"compared: {len(both)} stages in {len(layers)} layers ({_spans(layers)})"]
    for who, d, other in (("only in the dump checked", da, db), ("only in the reference", db, da)):
        alone = [n for n in d.names if n not in other]
        if alone:
            lines.append(f"{who}: {len(alone)} ({', '.join(alone[:6])}{', ...' if len(alone) > 6 else ''})")
    known = known_stages(db.manifest.get("arch") or da.manifest.get("arch"))
    for n in dict.fromkeys([*da.names, *db.names]):
        stage = split_name(n)[0]
        if stage not in known:
            close = difflib.get_close_matches(stage, known, n=1)
            lines.append(f"unknown stage '{n}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    return lines


def _spans(layers):  # [0, 1, 2, 5] -> "0-2, 5"
    spans, start = [], None
    for i, n in enumerate(layers):
        start = n if start is None else start
        if i + 1 == len(layers) or layers[i + 1] != n + 1:
            spans.append(f"{start}-{n}" if n > start else f"{n}")
            start = None
    return ", ".join(spans) or "none"


def plot(rows, path):
    """Layer x stage heatmap of log10(max_rel), the picture to look at first."""
    try:
        import matplotlib
    except ImportError:
        raise RefllamaError("--plot needs matplotlib: pip install 'refllama[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = list(dict.fromkeys(r["stage"] for r in rows if r["layer"] is not None))
    layers = sorted({r["layer"] for r in rows if r["layer"] is not None})
    grid = np.full((len(layers), len(stages)), np.nan)
    for r in rows:
        if r["layer"] is not None:
            grid[layers.index(r["layer"]), stages.index(r["stage"])] = np.log10(max(r["max_rel"], 1e-12))
    fig, ax = plt.subplots(figsize=(1 + 0.5 * len(stages), 1.5 + 0.3 * len(layers)))
    im = ax.imshow(grid, aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(stages)), stages, rotation=60, ha="right")
    ax.set_yticks(range(len(layers)), [str(n) for n in layers])
    ax.set_xlabel("stage")
    ax.set_ylabel("layer")
    for r in rows:
        if r["layer"] is not None and not r["ok"]:
            ax.add_patch(plt.Rectangle((stages.index(r["stage"]) - 0.5, layers.index(r["layer"]) - 0.5), 1, 1,
                                       fill=False, edgecolor="red", linewidth=2))
    fig.colorbar(im, ax=ax, label="log10(max abs error / reference range)")
    ax.set_title("error per stage (red: past tolerance)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m refllama.compare", description=__doc__.splitlines()[0])
    p.add_argument("dir_a", help="dump to check")
    p.add_argument("dir_b", help="reference dump")
    p.add_argument("--tol-table", help="a markdown tolerance table like checkpoints/README.md's (default: the "
                   "table in refllama.tolerances, which that one equals)")
    p.add_argument("--reference", choices=REFERENCE_KINDS, help="tolerance column (default: from DIR_B's producer)")
    p.add_argument("--plot", help="write a layer x stage heatmap of the error to this PNG")
    p.add_argument("--all", action="store_true", help="print every stage, not only the failing ones and a summary")
    args = p.parse_args(argv)
    try:
        table = read_tolerances(args.tol_table) if args.tol_table else TOLERANCES
        rows, first, kind = compare(args.dir_a, args.dir_b, table, args.reference)
        summary = coverage(args.dir_a, args.dir_b)
        if args.plot:
            plot(rows, args.plot)
    except RefllamaError as e:
        print(f"refllama.compare: error: {e}", file=sys.stderr)
        return 2
    print(f"{'stage':<18} {'max_abs':>10} {'max_rel':>10} {'nmse':>10} {'cosine':>10}  tolerance ({kind}: rel, nmse)")
    for r in rows:
        if args.all or not r["ok"]:
            tol = f"{r['tol'][0]:.0e}, {r['tol'][1]:.0e}" if r["tol"] else "none"
            print(f"{r['name']:<18} {r['max_abs']:10.3e} {r['max_rel']:10.3e} {r['nmse']:10.3e} {r['cosine']:10.6f}"
                  f"  {tol}{'' if r['ok'] else '  FAIL'}")
    print("\n".join(summary))
    if first is None:
        print(f"all {len(rows)} stages within tolerance")
        return 0
    print(f"first divergence: {first['name']} (max_rel {first['max_rel']:.3e}, nmse {first['nmse']:.3e})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
