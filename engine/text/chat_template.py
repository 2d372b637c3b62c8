"""The GGUF's Jinja chat template, rendered in jinja2's sandbox (templates come from files)."""

from __future__ import annotations

from datetime import datetime

from engine.errors import PromptError, UnsupportedModelError

ROLES = ("system", "user", "assistant")


class TemplateError(PromptError):
    pass


class ChatTemplate:
    """``template_source`` says where the template came from: "gguf" (the file's own) or
    "builtin:<family>" (engine/text/builtin_templates.py); ``end_of_turn`` is the text of the token that
    closes a turn in the built-in format (generation stops on it), "" when the file's template decides."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", template_source: str = "gguf",
                 end_of_turn: str = ""):
        from jinja2 import TemplateSyntaxError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(f"the chat template refused these messages: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except TemplateSyntaxError as exc:
            raise UnsupportedModelError(f"the model's chat template is not valid Jinja: {exc}") from exc
        self.source = source
        self.bos_token, self.eos_token = bos_token, eos_token
        self.template_source, self.end_of_turn = template_source, end_of_turn

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        validate_messages(messages)
        from jinja2 import TemplateError as JinjaError

        try:
            return self._template.render(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token, eos_token=self.eos_token,
            )
        except TemplateError:
            raise
        except JinjaError as exc:
            raise TemplateError(f"the chat template failed to render: {exc}") from exc


def validate_messages(messages: object) -> None:
    """Messages must be a non-empty list of {"role", "content"} with text content."""
    if not isinstance(messages, list) or not messages:
        raise PromptError("messages must be a non-empty list of {\"role\", \"content\"} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise PromptError(f"message {i} must be an object with \"role\" and \"content\"")
        if m["role"] not in ROLES:
            raise PromptError(f"message {i} has role {m['role']!r}; use one of: {', '.join(ROLES)}")
        if not isinstance(m["content"], str):
            raise PromptError(f"message {i} content must be text")
    if not any(m["content"].strip() for m in messages if m["role"] == "user"):
        raise PromptError("the prompt is empty: write a message first")
