"""The one exception refllama raises for bad input: its message names the file, tensor, field or token."""

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escape(text):
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def shown(value, limit=60):
    """A value taken from a file or a request, fit for a one-line message: quoted, control characters and lone
    surrogates escaped, shortened to about `limit` characters."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        return f"{text[:limit]!r}... ({len(text)} characters)"
    return repr(text)  # repr escapes every character that does not print


class RefllamaError(Exception):
    """A problem with the user's input (model file, option, prompt), reported in one line: whatever the message
    carries, newlines and terminal control characters come out escaped."""

    def __str__(self):
        return _escape(super().__str__().encode("utf-8", "backslashreplace").decode("utf-8"))
