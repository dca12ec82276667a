"""The harness: the dump format, the compare engine (stage by stage, re-running each side's stages), the diagnosis of
the first diverging stage, the logits verdict and the tolerance table. `python -m refllama.compare` is its command."""
