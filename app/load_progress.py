"""The status bar's part while the model converts: what step it is on, how far, and Cancel; after a
cancel, the plain news that no model is loaded, with Try again. The window stays usable meanwhile
(the conversion runs on the engine thread)."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget

from engine.types import SetupProgress

NOT_LOADED = "The model was not loaded: you cancelled its conversion."
CANCELLED = "— you cancelled its conversion."


def step_text(progress: SetupProgress) -> str:
    """"Layer 3 of 30" from "layer 3 of 30": a step as a sentence's start."""
    step = progress.step or "preparing the model"
    return step[:1].upper() + step[1:]


class LoadProgress(QWidget):
    cancel_requested = Signal()
    retry_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setAccessibleName("Model conversion")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        self.label = QLabel("")
        row.addWidget(self.label)
        self.bar = QProgressBar()
        self.bar.setAccessibleName("Conversion progress")
        self.bar.setMaximumWidth(160)
        row.addWidget(self.bar)
        self.cancel = QPushButton("Cancel")
        self.cancel.setAccessibleName("Cancel the model's conversion")
        self.cancel.setToolTip("Stop converting the model; nothing half-done is kept")
        self.cancel.clicked.connect(self._on_cancel)
        row.addWidget(self.cancel)
        self.retry = QPushButton("Try again")
        self.retry.setAccessibleName("Load the model again")
        self.retry.clicked.connect(self._on_retry)
        row.addWidget(self.retry)
        self.cancelling = False
        self.hide()

    def converting(self, progress: SetupProgress) -> None:
        if self.isHidden():  # a new conversion (or a retry): Cancel is offered again
            self.cancelling = False
        if not self.cancelling:  # reports already on their way do not undo "Cancelling…"
            self.label.setText(f"Preparing the model for this computer: {progress.step or '…'}")
        self.cancel.setEnabled(not self.cancelling)
        self.bar.setRange(0, max(progress.total, 0))
        self.bar.setValue(progress.done)
        self.bar.show()
        self.cancel.show()
        self.retry.hide()
        self.show()

    def cancelled(self) -> None:
        """Beside the model label's "The model was not loaded"."""
        self.label.setText(CANCELLED)
        self.bar.hide()
        self.cancel.hide()
        self.retry.show()
        self.show()

    def _on_cancel(self) -> None:
        self.cancelling = True
        self.cancel.setEnabled(False)  # until the engine stops at its next step
        self.label.setText("Cancelling the conversion…")
        self.cancel_requested.emit()

    def _on_retry(self) -> None:
        self.hide()
        self.retry_requested.emit()
