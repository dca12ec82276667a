"""The one exception refllama raises for bad input: its message names the file, tensor, field or token."""


class RefllamaError(Exception):
    """A problem with the user's input (model file, option, prompt), reported in one line."""
