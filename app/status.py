"""The status bar: how the last turn started, decode speed, context use, and the model. The wording is
in app/text.py; this only decides which label shows what."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QStatusBar

from app.text import context_label, model_label, model_tooltip, resume_summary
from engine.types import Finished, ModelInfo, Resume


class StatusLine:
    def __init__(self, bar: QStatusBar):
        self.model = QLabel("")
        self.context = QLabel("")
        self.speed = QLabel("")
        self.resume = QLabel("")
        self.resume.setAccessibleName("How the last turn started")
        bar.addWidget(self.resume, 1)
        for label in (self.speed, self.context, self.model):
            bar.addPermanentWidget(label)
        self.limit: int | None = None  # the model's context window, once loaded

    def model_ready(self, info: ModelInfo) -> None:
        self.limit = info.context_length
        self.model.setText(model_label(info))
        self.model.setToolTip(model_tooltip(info))
        self.context.setText(context_label(0, info.context_length))

    def tokens_in_context(self, used: int) -> None:
        if self.limit is not None:
            self.context.setText(context_label(used, self.limit))

    def resumed(self, resume: Resume) -> None:
        self.resume.setText(resume_summary(resume))
        self.tokens_in_context(resume.reused_tokens + resume.prefilled_tokens)

    def finished(self, finished: Finished) -> None:
        if finished.timings.decode_tokens_per_s:
            self.speed.setText(f"{finished.timings.decode_tokens_per_s:.1f} tokens/s")
        self.limit = finished.context_limit
        self.tokens_in_context(finished.context_tokens)

    def say(self, text: str) -> None:
        self.resume.setText(text)

    def problem(self, message: str) -> None:
        self.resume.setText(f"⚠ {message}")
