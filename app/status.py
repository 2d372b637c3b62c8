"""The status bar: how the last turn started, decode speed, context use, and the model. The wording is
in app/text.py; this only decides which label shows what."""

from __future__ import annotations

import time

from PySide6.QtWidgets import QLabel, QSizePolicy, QStatusBar

from app.elided_label import ElidedLabel
from app.text import (
    context_label,
    duration,
    model_label,
    model_tooltip,
    resume_summary,
    server_cache_note,
    short_model_label,
)
from app.turns import LiveFigures
from engine.types import Finished, ModelInfo, Resume


def speed_label(tokens_per_s: float | None, ttft_ms: float | None, drafted: int = 0, accepted: int = 0) -> str:
    """'first token in 0.4 s · 21.3 tokens/s · 40 of 52 drafted tokens accepted'; a part left out while it
    is not known (the drafts: when prompt lookup drafted none)."""
    parts = [] if ttft_ms is None else [f"first token in {duration(ttft_ms)}"]
    if tokens_per_s:
        parts.append(f"{tokens_per_s:.1f} tokens/s")
    if drafted:
        parts.append(f"{accepted} of {drafted} drafted tokens accepted")
    return " · ".join(parts)


MODEL_LEAST_PX = 160  # the model label is cut no narrower, so the model's name always starts there


class StatusLine:
    """How the width is shared: the turn's line asks for its whole text and no more (the blank room goes
    between it and the figures); the model label has the stretch, so what the line leaves goes to it first,
    up to its whole label (its name without the quantization suffix when that does not fit). Short of room,
    the model label gives way down to MODEL_LEAST_PX, then the line is cut; both whole in their tooltips."""

    def __init__(self, bar: QStatusBar):
        self.model = ElidedLabel(preferred_width=None, least_width=MODEL_LEAST_PX)
        self.model.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self.model.setAccessibleName("Model")
        self.context = QLabel("")
        self.speed = QLabel("")
        self.speed.setAccessibleName("Reply speed")
        self.context.setAccessibleName("Tokens in the context")
        self.resume = ElidedLabel(preferred_width=None)
        self.resume.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self.resume.setAccessibleName("How the last turn started")
        bar.addWidget(self.resume)
        bar.addPermanentWidget(self.speed)
        bar.addPermanentWidget(self.context)
        bar.addPermanentWidget(self.model, 1)
        self.limit: int | None = None  # the model's context window, once loaded
        self.used = 0  # tokens the chat shown holds, as the meter last said
        self._model_key: str | None = None  # the model those figures are of

    def model_ready(self, info: ModelInfo) -> None:
        if self._model_key is not None and info.key != self._model_key:
            self.speed.setText("")  # the last turn's figures were the other model's (its opening says how it starts)
            self.resume.setText("")
        self._model_key = info.key
        self.limit = info.context_length
        self.model.setText(model_label(info), short_model_label(info))
        self.model.set_note(model_tooltip(info))
        self.context.setText(context_label(0, info.context_length))

    def tokens_in_context(self, used: int) -> None:
        self.used = used
        if self.limit is not None:
            self.context.setText(context_label(used, self.limit))

    def resumed(self, resume: Resume) -> None:
        self.resume.setText(resume_summary(resume))
        self.tokens_in_context(resume.reused_tokens + resume.prefilled_tokens)

    def finished(self, finished: Finished) -> None:
        t = finished.timings
        self.speed.setText(speed_label(t.decode_tokens_per_s or None, t.ttft_ms or None, t.drafted_tokens,
                                       t.accepted_tokens))
        self.limit = finished.context_limit
        self.tokens_in_context(finished.context_tokens)
        if finished.local is None:  # a remote server's turn: what it said of its prefix cache
            self.resume.setText(server_cache_note(finished))

    def live(self, figures: LiveFigures) -> None:
        """A reply being written: its speed so far, and the context filling as its tokens arrive."""
        self.speed.setText(speed_label(figures.tokens_per_s(time.monotonic()), figures.ttft_ms))
        if figures.context_tokens:
            self.tokens_in_context(figures.context_tokens)

    def clear_chat(self) -> None:
        """Another chat is shown: nothing of the previous one's turn stays (its own figures come as it opens)."""
        self.resume.setText("")
        self.speed.setText("")
        self.tokens_in_context(0)

    def say(self, text: str) -> None:
        self.resume.setText(text)

    def problem(self, message: str) -> None:
        self.resume.setText(f"⚠ {message}")
