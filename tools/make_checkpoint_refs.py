"""Regenerate checkpoints/ref/: llama.cpp and transformers dumps of SmolLM2 for the checkpoint suite's prompts
(with --gemma3, checkpoints/ref-gemma3/: Gemma 3 270M's, four prompts, one longer than its 512-token window, blocks
0, 1, 3 (local), 5 (global) and 17 (the last)).

Kept: blocks 0, 1, 15 and 29 (with each one's input), embeddings, final norm; the first 8 and last 12
token positions of longer prompts (K and V: all); logits for the last 4 positions; 64 greedy tokens (llama.cpp's
in its manifest); the same stages for 4 greedy decode steps after the prefill.
Both are stored as float32: transformers agrees with refllama to ~1e-6, and llama.cpp with refllama's numerics
"ggml" to the bit, which float16 (5e-4) would hide. Gemma 3's llama.cpp stages are float16 (its references are
checked in float32 numerics only).

    python tools/make_checkpoint_refs.py      # ~3 minutes on 2 cores; needs both reference tools (README)
    python tools/make_checkpoint_refs.py --gemma3   # ~5 minutes; needs the Gemma 3 package too
    python tools/make_checkpoint_refs.py --gemma3 --prompts long   # one prompt's references
"""

import argparse
import shutil
from pathlib import Path

import dump_hf
import dump_llamacpp

from refllama.api import gemma3_path

LONG = (
    "The printing press changed how knowledge moved through Europe. Before Gutenberg, a book was copied by hand, "
    "letter by letter, often in a monastery, and a single Bible could take a scribe more than a year. Around 1440 "
    "Johannes Gutenberg combined movable metal type, an oil-based ink and a screw press adapted from wine making. "
    "By 1500, presses in more than two hundred and fifty cities had printed perhaps twenty million volumes. Prices "
    "fell, literacy rose, and scholars could compare identical copies of a text for the first time. Errors could be "
    "corrected in the next edition instead of multiplying with every copy. Pamphlets spread the arguments of the "
    "Reformation within weeks, and scientists such as Copernicus and Vesalius published detailed diagrams that "
    "readers in distant cities saw exactly as the author intended. Standardised spelling and grammar followed, as "
    "printers chose one form of a word and repeated it thousands of times. In short, the press turned knowledge "
    "from a scarce, fragile possession into something that could be shared, checked and built upon. Summarise the "
    "three most important consequences of the printing press in one sentence each:"
)
PROMPTS = {
    "short": ("The capital of France is", False),
    "chat": ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
             "<|im_start|>user\nGive me two tips for learning a new language.<|im_end|>\n"
             "<|im_start|>assistant\n", True),
    "long": (LONG, False),
    "unicode": ("Übersetze: «Ça va très bien» — 東京は日本の首都です。Emoji: 🤖🚀. Answer:", False),
}
GEMMA3_PROMPTS = {
    "short": PROMPTS["short"],
    "chat": ("<start_of_turn>user\nGive me two tips for learning a new language.<end_of_turn>\n<start_of_turn>model\n",
             True),
    "unicode": PROMPTS["unicode"],
    # past the 512-token window: its last positions' local layers see 512 keys, the global layers all of them
    "long": (" ".join([LONG] * 3), False),
}
STORAGE = ["--layers", "0,1,15,-1", "--max-rows", "20", "--logit-rows", "4", "--greedy", "64", "--decode-steps", "4"]
# Gemma 3 270M's vocabulary is 262144 tokens, a logits row 1 MB in float32: fewer rows and decode steps
GEMMA3_STORAGE = ["--layers", "0,1,3,5,-1", "--max-rows", "12", "--logit-rows", "1", "--greedy", "16",
                  "--decode-steps", "2"]
# the long prompt keeps a local and two global blocks: every position's K and V is kept, the bulk of it
GEMMA3_LONG_STORAGE = ["--layers", "0,5,-1", *GEMMA3_STORAGE[2:]]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gemma3", action="store_true", help="Gemma 3 270M's references (checkpoints/ref-gemma3/)")
    p.add_argument("--prompts", help="comma-separated prompt names to remake (default: all)")
    args = p.parse_args()
    root = Path(__file__).resolve().parent.parent / "checkpoints" / ("ref-gemma3" if args.gemma3 else "ref")
    prompts, storage = (GEMMA3_PROMPTS, GEMMA3_STORAGE) if args.gemma3 else (PROMPTS, STORAGE)
    model = ["-m", gemma3_path()] if args.gemma3 else []
    for name, (text, special) in prompts.items():
        if args.prompts and name not in args.prompts.split(","):
            continue
        llamacpp_storage = ["--float16"] if args.gemma3 else []
        for tool, sub, extra in ((dump_llamacpp, "llamacpp", llamacpp_storage), (dump_hf, "hf", [])):
            out = root / sub / name
            shutil.rmtree(out, ignore_errors=True)
            kept = GEMMA3_LONG_STORAGE if args.gemma3 and name == "long" else storage
            tool.main([*model, "-p", text, "-o", str(out), *kept, *extra] + (["--special"] if special else []))


if __name__ == "__main__":
    main()
