"""Chat messages as a front end receives them, checked before any model loads (bad input fails fast)."""

from __future__ import annotations


def validate_messages(messages: object) -> None:
    """Messages must be a non-empty list of {"role", "content"} with text content; PromptError otherwise."""
    from engine.text.chat_template import validate_messages as check  # the chat template's own rule

    check(messages)
