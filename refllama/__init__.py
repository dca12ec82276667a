"""refllama: a NumPy-first reference implementation of Llama-family inference, checkpointed stage by stage."""

from .api import Model, load
from .errors import RefllamaError

__all__ = ["Model", "RefllamaError", "load"]
__version__ = "0.1.0"
