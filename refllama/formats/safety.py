"""Reading what an attacker may have written: JSON with shape and size limits, files that must be regular and stay
inside their model directory, and memory that a file asks for, checked before it is allocated.
"""

import json
import os
import stat
from pathlib import Path

from ..errors import RefllamaError, shown

MAX_JSON_DEPTH = 64
MAX_JSON_DIGITS = 64  # integer literals longer than this are refused before Python converts them


def _number(text):
    if len(text.lstrip("-")) > MAX_JSON_DIGITS:
        raise ValueError(f"a number of {len(text)} digits")
    return int(text)


def _constant(name):
    raise ValueError(f"{name} is not JSON")


def _depth_and_text(value):
    """Depth of a parsed JSON value, walked without recursion; lone surrogates in strings are refused."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, depth = todo.pop()
        deepest = max(deepest, depth)
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(v, dict):
            todo += [(k, depth + 1) for k in v] + [(x, depth + 1) for x in v.values()]
        elif isinstance(v, list):
            todo += [(x, depth + 1) for x in v]
        elif isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"a string with a lone surrogate ({shown(v)})") from None
    return deepest


def parse_json(text, what):
    """A JSON document (bytes or str) whose top level is an object, or an error naming `what`: standard JSON only
    (no NaN/Infinity), bounded depth and integer size, UTF-8 strings."""
    try:
        value = json.loads(text, parse_int=_number, parse_constant=_constant)
        if not isinstance(value, dict):
            raise ValueError(f"expected a JSON object, got {type(value).__name__}")
        _depth_and_text(value)
    except RecursionError:
        raise RefllamaError(f"{what}: invalid JSON (nested too deeply)") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise RefllamaError(f"{what}: invalid JSON ({e})") from None
    return value


def read_regular(path, limit=None):
    """The bytes of `path`, which must be a regular file (not a directory, FIFO or device); opened without
    blocking, so that a FIFO cannot hang the reader. `limit`: refuse files larger than this many bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise RefllamaError(f"{path}: no such file") from None
    except OSError as e:
        raise RefllamaError(f"{path}: cannot open ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RefllamaError(f"{path}: not a regular file")
        if limit is not None and st.st_size > limit:
            raise RefllamaError(f"{path}: {st.st_size} bytes, more than the {limit} allowed for it")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


def read_json(path, limit=64 << 20):
    """A JSON object from a regular file, with parse_json's limits."""
    return parse_json(read_regular(path, limit), str(path))


def check_regular(path):
    """`path` exists and is a regular file (symlinks followed), or an error naming it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise RefllamaError(f"{path}: no such file") from None
    except OSError as e:
        raise RefllamaError(f"{path}: cannot read ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise RefllamaError(f"{path}: not a regular file")


def inside(directory, name, listed_in):
    """directory / name for a file name read from `listed_in`: a relative path that stays inside the directory
    (no absolute path, no '..', no symlink out). Whoever opens it checks that it is a regular file."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise RefllamaError(f"{listed_in}: file name {shown(name)} is not a file name")
    if os.path.isabs(name) or ".." in Path(name).parts:
        raise RefllamaError(f"{listed_in}: file name {shown(name)} leaves the model directory")
    try:
        root = Path(directory).resolve()
        path = (root / name).resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop: RuntimeError before Python 3.13, OSError since
        raise RefllamaError(f"{listed_in}: file {shown(name)} cannot be resolved ({e})") from None
    if not path.is_relative_to(root):
        raise RefllamaError(f"{listed_in}: file {shown(name)} is a link out of the model directory")
    return Path(directory) / name


def available_memory(xp=None):
    """Bytes this process could still allocate: the GPU's free memory for CuPy, else MemAvailable from
    /proc/meminfo (Linux); None if unknown."""
    if xp is not None and xp.__name__ == "cupy":
        return xp.cuda.runtime.memGetInfo()[0]
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def gib(n):
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def check_memory(n_bytes, what, hint, xp=None):
    """Refuse to allocate `n_bytes` for `what` (on array module xp) beyond the memory available now."""
    limit = available_memory(xp)
    if limit is not None and n_bytes > limit:
        raise RefllamaError(f"{what} needs {gib(n_bytes)}, more than the {gib(limit)} available; {hint}")
