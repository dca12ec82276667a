"""refllama: a NumPy-first reference implementation of Llama-family inference, checkpointed stage by stage."""

from .api import Model, load
from .errors import RefllamaError
from .trace import trace
from .xp import set_threads, version

__all__ = ["Model", "RefllamaError", "load", "set_threads", "trace"]
__version__ = version()
