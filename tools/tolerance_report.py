"""Summarise measured checkpoint errors: the largest max_rel and NMSE per stage, reference and mode.

    REFLLAMA_CHECKPOINT_LOG=/tmp/errors.jsonl python -m pytest checkpoints/ -q
    python tools/tolerance_report.py /tmp/errors.jsonl
The tolerance table in checkpoints/README.md was set from this report (see the table's notes).
"""

import json
import sys
from collections import defaultdict

from refllama.arch.llama import STAGES as LAYER_STAGES
from refllama.check.tolerances import REFERENCE_KINDS

ORDER = ["inp_embd", *LAYER_STAGES, "result_norm", "result_output"]


def main(path):
    worst = defaultdict(lambda: [0.0, 0.0])
    for line in open(path, encoding="utf-8"):
        r = json.loads(line)
        w = worst[(r["stage"], r["kind"], r["mode"])]
        w[0], w[1] = max(w[0], r["max_rel"]), max(w[1], r["nmse"])
    print(f"{'stage':<14} {'reference':<13} {'isolated rel':>12} {'nmse':>9} {'end_to_end rel':>15} {'nmse':>9}")
    for stage in ORDER:
        for kind in REFERENCE_KINDS:
            iso, e2e = worst.get((stage, kind, "isolated")), worst.get((stage, kind, "end_to_end"))
            if iso or e2e:
                iso, e2e = iso or [float("nan")] * 2, e2e or [float("nan")] * 2
                print(f"{stage:<14} {kind:<13} {iso[0]:12.2e} {iso[1]:9.2e} {e2e[0]:15.2e} {e2e[1]:9.2e}")


if __name__ == "__main__":
    main(sys.argv[1])
