"""How close a correct engine comes to compare's bands: tests/engine.py (an independent NumPy Llama) run clean in
float32 and bfloat16 on SmolLM2 over three prompts with 2 decode steps, compared with refllama's dump of the same
tokens. Prints, per run, the worst local and end-to-end error as a fraction of its band (where
refllama.check.tolerances.rounding_bands was set from).

    python tools/engine_margins.py
"""

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from engine import Engine, Weights  # noqa: E402

import refllama  # noqa: E402
from refllama.api import default_model_path  # noqa: E402
from refllama.check.compare import compare  # noqa: E402
from refllama.check.dump import Dump  # noqa: E402

PROMPTS = ["The quick brown fox jumps over",
           "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n" * 3,
           "word " * 40]


def worst(rows, metric, key, band):
    return max(((r[key][metric] if key else r[metric]) / r[band][0 if metric == "max_rel" else 1], r["name"])
               for r in rows if key is None or key in r)


def main():
    weights, m = Weights(default_model_path()), refllama.load()
    tmp = Path(tempfile.mkdtemp())
    for k, prompt in enumerate(PROMPTS):
        ids = m.tokenize(prompt)
        for numerics in ("float32", "bfloat16"):
            mine = Engine(weights, (), numerics).dump(ids, tmp / f"mine-{k}-{numerics}", decode_steps=2)
            ref = m.dump(ids, tmp / f"ref-{k}-{numerics}", decode_ids=Dump(mine).decode_ids)
            rep = compare(mine, ref, m)
            print(f"{len(ids):3d} tokens {numerics:8s} first divergence: {rep.first and rep.first['name']}")
            for label, metric, key, band in (("local max_rel", "max_rel", "local_MINE", "local_tol"),
                                             ("local nmse", "nmse", "local_MINE", "local_tol"),
                                             ("end-to-end max_rel", "max_rel", None, "tol"),
                                             ("end-to-end nmse", "nmse", None, "tol")):
                frac, name = worst(rep.rows, metric, key, band)
                print(f"    {label:<19} {frac:8.2%} of its band ({name})")


if __name__ == "__main__":
    main()
