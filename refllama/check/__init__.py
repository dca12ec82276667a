"""The harness: the dump format, the compare engine (stage by stage, re-running each side's stages), the diagnosis of
the first diverging stage, the logits verdict and the tolerance table. `python -m refllama.compare` is its command;
DumpWriter (and torch_hooks, for a PyTorch model) writes the format from any Python engine."""

from .writer import DumpWriter, torch_hooks

__all__ = ["DumpWriter", "torch_hooks"]
