"""The chat-template renderer, run as its own short-lived process by refllama.formats.chat (never imported by refllama).

A template is a program from the model file. jinja2's sandbox stops it from reaching Python's internals, but not
from looping for hours, building a gigabyte string or recursing until the interpreter aborts; in a process of its
own, under a memory limit and a CPU-time limit, with the parent's timeout on top, none of that reaches refllama.
Reads {"template", "context", "max_chars", "max_bytes"} as JSON on stdin; writes {"text"} or {"error"} on stdout.
"""

import json
import resource
import sys
from datetime import datetime


def main():
    job = json.loads(sys.stdin.read())
    resource.setrlimit(resource.RLIMIT_AS, (job["max_bytes"], job["max_bytes"]))
    resource.setrlimit(resource.RLIMIT_CPU, (job["max_seconds"], job["max_seconds"] + 1))
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals.update(raise_exception=raise_exception,
                           strftime_now=lambda fmt: datetime.now().strftime(fmt))
        pieces, n = [], 0
        for piece in env.from_string(job["template"]).generate(**job["context"]):
            n += len(piece)
            if n > job["max_chars"]:
                raise OverflowError(f"it renders more than {job['max_chars']} characters")
            pieces.append(piece)
        out = {"text": "".join(pieces)}
    except TemplateError as e:
        out = {"error": f"{type(e).__name__}: {e}"}
    except MemoryError:
        out = {"error": f"it needs more than the {job['max_bytes'] >> 20} MiB allowed"}
    except RecursionError:
        out = {"error": "it recurses too deeply"}
    except Exception as e:  # whatever the template made Python raise is the template's failure
        out = {"error": f"{type(e).__name__}: {e}"}
    sys.stdout.write(json.dumps(out))


if __name__ == "__main__":
    main()
