"""Chat prompts: the model's own jinja2 chat template rendered in a sandbox, as transformers renders it."""

from datetime import datetime

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import RefllamaError


def _raise_exception(message):
    raise TemplateError(message)


def render(template, messages, bos_token="", eos_token="", add_generation_prompt=True):
    """The prompt text for `messages` ([{"role": ..., "content": ...}]) under the model's template."""
    if not template:
        raise RefllamaError("this model has no chat template (tokenizer.chat_template); use a plain prompt")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise RefllamaError(f"chat message {i} must be a dict with string 'role' and 'content'")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals.update(raise_exception=_raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    try:
        return env.from_string(template).render(
            messages=messages, bos_token=bos_token, eos_token=eos_token, add_generation_prompt=add_generation_prompt
        )
    except TemplateError as e:
        raise RefllamaError(f"chat template failed: {e}") from None
