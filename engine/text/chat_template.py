"""The GGUF's Jinja chat template, rendered in a bounded sandbox (templates come from files)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.errors import PromptError, TemplateError, UnsupportedModelError
from engine.text.template_render import (
    RENDER_SECONDS,
    ROLES,
    LocalTemplate,
    check_variables,
    one_line,
    validate_messages,
)

__all__ = ["ROLES", "ChatTemplate", "TemplateError", "one_line", "validate_messages"]


class ChatTemplate:
    """``template_source`` says where the template came from: "gguf" (the file's own) or
    "builtin:<family>" (engine/text/builtin_templates.py); ``end_of_turn`` is the text of the token that
    closes a turn in the built-in format (generation stops on it), "" when the file's template decides.
    ``name`` is how errors call it ("the chat template in model.gguf"); ``refused`` is why the file's own
    template was set aside for this built-in one, or ""."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", template_source: str = "gguf",
                 end_of_turn: str = "", name: str = "the model's chat template", refused: str = "",
                 isolated: bool | None = None):
        """``isolated`` (default: for a file's own template) compiles and renders it in the child process
        of engine/text/template_worker.py, which is killed past its limits; built-in templates are ours
        and render here."""
        self.name = name
        self.source = source
        self.bos_token, self.eos_token = bos_token, eos_token
        self.template_source, self.end_of_turn = template_source, end_of_turn
        self.refused = refused
        self.isolated = template_source == "gguf" if isolated is None else isolated
        self._local: LocalTemplate | None = None
        if self.isolated:
            self._in_worker(None, False, RENDER_SECONDS)  # compiled there: jinja folds constants while compiling
        else:
            self._local = LocalTemplate(source, bos_token, eos_token, name)

    def _in_worker(self, messages: list[dict] | None, add_generation_prompt: bool, seconds: float,
                   tools: list[dict] | None = None, variables: Mapping[str, Any] | None = None) -> str:
        from engine.text import template_worker

        try:
            return template_worker.render(self.source, self.bos_token, self.eos_token, messages,
                                          add_generation_prompt, seconds, tools, dict(variables or {}))
        except (TemplateError, UnsupportedModelError, PromptError) as exc:
            raise type(exc)(f"{self.name} {exc}".strip()) from None

    @property
    def speaks_tools(self) -> bool:
        """The template itself renders ``tools`` (else engine/text/reply_format.py's fallback prompt does)."""
        return "tools" in self.source

    def render(self, messages: list[dict], add_generation_prompt: bool = True,
               seconds: float = RENDER_SECONDS, *, tools: list[dict] | None = None,
               variables: Mapping[str, Any] | None = None) -> str:
        """The prompt text; a TemplateError naming the template if it fails or runs past its limits.
        ``tools`` and ``variables`` (``chat_template_kwargs``) reach the template as top-level names."""
        if self.isolated:
            validate_messages(messages)
            check_variables(variables)
            return self._in_worker(messages, add_generation_prompt, seconds, tools, variables)
        return self._local.render(messages, add_generation_prompt, seconds, tools=tools, variables=variables)
