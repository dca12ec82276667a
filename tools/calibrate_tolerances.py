"""Measure how far refllama's stages are from llama.cpp's over many prompts and every layer.

For each prompt: a llama.cpp dump (tools/dump_llamacpp.py) and a refllama dump of all layers and
positions, compared stage by stage; prints the worst max_rel and NMSE per stage over all prompts and
layers, and how many times the current table's tolerance that is. The llama.cpp column of the table in
checkpoints/README.md was set from this report (about 3x the worst max_rel, 5x the worst NMSE).

    python tools/calibrate_tolerances.py          # ~3 minutes; needs llama-cpp-python (README)
"""

import tempfile
from collections import defaultdict
from pathlib import Path

import dump_llamacpp  # tools/, on the path of a script run from it
from make_checkpoint_refs import LONG

import refllama
from refllama.arch.llama import STAGES as LAYER_STAGES
from refllama.check.compare import compare
from refllama.check.tolerances import band

PROMPTS = [
    "Write a haiku about the sea.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "In 1969, Neil Armstrong became the first person to walk on the Moon. He said: \"That's one small step for man, "
    "one giant leap for mankind.\" Many people watched on television. Explain why it mattered.",
    "1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987,",
    "Quelle est la capitale de l'Allemagne ? Réponds en une phrase. Und auf Deutsch?",
    "the the the the the the the the the the the the the the the the the the the the",
    "<|im_start|>user\nList three fruits.<|im_end|>\n<|im_start|>assistant\n",
    LONG[:600],
]


def main():
    model = refllama.load()
    worst = defaultdict(lambda: [0.0, 0.0, ""])
    with tempfile.TemporaryDirectory() as d:
        for i, text in enumerate(PROMPTS):
            special = text.startswith("<|im_start|>")
            ref = Path(d) / f"lc{i}"
            dump_llamacpp.main(["-p", text, "-o", str(ref)] + (["--special"] if special else []))
            ids = model.tokenize(text, parse_special=special)
            ours = model.dump(ids, Path(d) / f"rl{i}")
            for r in compare(ours, ref, model, column="llama.cpp").rows:
                w = worst[r["stage"]]
                if r["max_rel"] > w[0]:
                    w[0], w[2] = r["max_rel"], f"{r['name']} prompt {i}"
                w[1] = max(w[1], r["nmse"])
    print(f"{'stage':<14} {'worst max_rel':>13} {'worst nmse':>11}  {'x tol rel':>9} {'x tol nmse':>10}  where")
    for stage in ["inp_embd", *LAYER_STAGES, "result_norm", "result_output"]:
        rel, nmse, where = worst[stage]
        tol = band("llama.cpp", stage)
        print(f"{stage:<14} {rel:13.2e} {nmse:11.2e}  {rel / tol[0]:9.2f} {nmse / tol[1]:10.2f}  {where}")


if __name__ == "__main__":
    main()
