"""A chat template compiled and rendered in this process, in the bounded sandbox of template_limits.py: what
built-in templates use, and what the template worker's child runs for a file's own template. Below both
chat_template.py and template_worker.py, so neither climbs to the other."""

from __future__ import annotations

from datetime import datetime

from engine.errors import PromptError, TemplateError, UnsupportedModelError
from engine.text import template_limits

ROLES = ("system", "user", "assistant")
RENDER_SECONDS = 5.0  # a real template renders a long conversation in milliseconds


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as a short single line: the template's errors are shown to the user as they are."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


class LocalTemplate:
    """``source`` compiled here; ``name`` is how errors call it ("the chat template in model.gguf")."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", name: str = "the model's chat template"):
        self.name = name
        self.bos_token, self.eos_token = bos_token, eos_token
        self._template = self._compile(source)

    def _compile(self, source: str):
        from jinja2 import TemplateSyntaxError

        def raise_exception(message: str) -> None:
            raise TemplateError(f"refused these messages: {message}")

        env = template_limits.BoundedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(str(fmt)[:200])
        # Folding constants runs template code: under a render's budget, so a hostile constant is not
        # folded (jinja leaves whatever raises to the render, where the same limit refuses it).
        token = template_limits.rendering_with(template_limits.Budget.for_input(0, 0, RENDER_SECONDS))
        try:
            return env.from_string(source)
        except TemplateSyntaxError as exc:
            raise UnsupportedModelError(f"{self.name} is not valid Jinja: {one_line(exc)}") from exc
        except Exception as exc:  # a file's template: too long, too deeply nested, a literal too large
            raise UnsupportedModelError(f"{self.name} cannot be compiled: {type(exc).__name__}: {one_line(exc)}") from exc
        finally:
            template_limits.done_rendering(token)

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
        except MemoryError:  # the template worker's address-space ceiling (engine/text/template_worker.py)
            raise TemplateError(f"{self.name} ran out of memory") from None
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
