"""The GGUF's Jinja chat template, rendered in a bounded sandbox (templates come from files)."""

from __future__ import annotations

from datetime import datetime

from engine.errors import PromptError, TemplateError, UnsupportedModelError
from engine.text import template_limits

__all__ = ["ROLES", "ChatTemplate", "TemplateError", "validate_messages"]

ROLES = ("system", "user", "assistant")
RENDER_SECONDS = 5.0  # a real template renders a long conversation in milliseconds


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as a short single line: the template's errors are shown to the user as they are."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ChatTemplate:
    """``template_source`` says where the template came from: "gguf" (the file's own) or
    "builtin:<family>" (engine/text/builtin_templates.py); ``end_of_turn`` is the text of the token that
    closes a turn in the built-in format (generation stops on it), "" when the file's template decides.
    ``name`` is how errors call it ("the chat template in model.gguf"); ``refused`` is why the file's own
    template was set aside for this built-in one, or ""."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", template_source: str = "gguf",
                 end_of_turn: str = "", name: str = "the model's chat template", refused: str = ""):
        from jinja2 import TemplateSyntaxError

        def raise_exception(message: str) -> None:
            raise TemplateError(f"refused these messages: {message}")

        env = template_limits.BoundedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(str(fmt)[:200])
        self.name = name
        try:
            self._template = env.from_string(source)
        except TemplateSyntaxError as exc:
            raise UnsupportedModelError(f"{name} is not valid Jinja: {one_line(exc)}") from exc
        except Exception as exc:  # a file's template: too long, too deeply nested, a literal too large
            raise UnsupportedModelError(f"{name} cannot be compiled: {type(exc).__name__}: {one_line(exc)}") from exc
        self.source = source
        self.bos_token, self.eos_token = bos_token, eos_token
        self.template_source, self.end_of_turn = template_source, end_of_turn
        self.refused = refused

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               seconds: float = RENDER_SECONDS) -> str:
        """The prompt text; a TemplateError naming the template if it fails or runs past its limits."""
        validate_messages(messages)
        chars = sum(len(m["content"]) for m in messages) + len(self.bos_token) + len(self.eos_token)
        token = template_limits.rendering_with(template_limits.Budget.for_input(chars, len(messages), seconds))
        try:
            return "".join(self._template.generate(
                messages=messages, add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token, eos_token=self.eos_token,
            ))
        except TemplateError as exc:  # a limit, or the template's raise_exception
            raise TemplateError(f"{self.name} {exc}") from None
        except Exception as exc:  # noqa: BLE001 (the template is foreign code: any failure is its own)
            raise TemplateError(f"{self.name} failed to render: {type(exc).__name__}: {one_line(exc)}") from None
        finally:
            template_limits.done_rendering(token)


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
