"""Chat prompts: the model's own jinja2 chat template rendered in a sandbox, as transformers renders it, in a process
of its own with time, output and memory limits (refllama/formats/template_sandbox.py says why)."""

import json
import math
import os
import signal
import subprocess
import sys

from ..errors import RefllamaError, shown

SANDBOX = os.path.join(os.path.dirname(__file__), "template_sandbox.py")
TIMEOUT_S = 5.0  # a chat template renders in milliseconds; this is far past any real one
MAX_CHARS = 4 << 20  # rendered prompt; tokenizing far more than any context holds is the next hazard
MAX_BYTES = 512 << 20  # the renderer's address space


def render(template, messages, bos_token="", eos_token="", add_generation_prompt=True, source="the model",
           timeout=TIMEOUT_S, max_chars=MAX_CHARS):
    """The prompt text for `messages` ([{"role": ..., "content": ...}]) under the model's template; any failure
    of the template (an error it raises, too long, too much output or memory, a crash) is one RefllamaError
    naming `source` and the cause."""
    if not template:
        raise RefllamaError(f"{source}: no chat template (tokenizer.chat_template); use a plain prompt")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise RefllamaError(f"chat message {i} must be a dict with string 'role' and 'content'")
    context = dict(messages=messages, bos_token=bos_token, eos_token=eos_token,
                   add_generation_prompt=add_generation_prompt)
    job = json.dumps({"template": template, "context": context, "max_chars": max_chars, "max_bytes": MAX_BYTES,
                      "max_seconds": math.ceil(timeout) + 1})  # the wall clock is meant to stop it first

    def failed(cause):
        return RefllamaError(f"{source}: chat template failed: {cause}")

    try:
        done = subprocess.run([sys.executable, "-I", SANDBOX], input=job.encode(), capture_output=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise failed(f"it ran longer than {timeout:g} s") from None
    if done.returncode == -signal.SIGXCPU:  # its CPU-time limit can fire before our wall clock on a busy machine
        raise failed(f"it ran longer than {timeout:g} s")
    if done.returncode != 0:
        why = (f"signal {signal.Signals(-done.returncode).name}" if done.returncode < 0
               else f"exit status {done.returncode}")
        raise failed(f"the renderer died ({why}; {shown(done.stderr.decode('utf-8', 'replace')[-200:], 120)})")
    try:
        out = json.loads(done.stdout)
        text = out.get("text")
        if text is not None:
            text.encode("utf-8")
    except (ValueError, UnicodeEncodeError, AttributeError) as e:
        raise failed(f"unreadable output ({shown(str(e))})") from None
    if text is None:
        raise failed(shown(str(out.get("error")), 200))
    return text
