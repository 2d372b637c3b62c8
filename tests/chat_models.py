"""Synthetic models that speak a real model's chat format: the real template (tests/templates/, test data) over a
tiny random network, with the format's marker tokens in the vocabulary as the real GGUFs have them."""

from __future__ import annotations

from pathlib import Path

from engine.model.synthetic import SyntheticSpec

TEMPLATES = Path(__file__).resolve().parent / "templates"
# Qwen3's added tokens for thinking, calls and results (user-defined in its GGUFs: they spell their text)
QWEN_MARKERS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")


def qwen3_chat_spec() -> SyntheticSpec:
    """Qwen3's architecture and real template; a context long enough for its tool preamble at a byte a token."""
    return SyntheticSpec(architecture="qwen3", head_dim=32, seed=13, context_length=4096,
                         chat_template=(TEMPLATES / "qwen3.jinja").read_text(encoding="utf-8"), user_tokens=QWEN_MARKERS)
