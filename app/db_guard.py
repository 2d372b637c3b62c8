"""Before the window opens the conversation store: check it, make the day's backup, and when it is
damaged, say so in plain words and offer to restore the newest good backup, or with no backup to rescue
every conversation that can still be read (the salvage).

The check (``PRAGMA quick_check``), the backup, the restore and the salvage run on a worker thread: on a large
database they take seconds, and the UI thread keeps painting meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import QObject, QThread, Signal
from PySide6.QtWidgets import QMessageBox, QWidget

from engine.api import (
    HearthPaths,
    RestoreResult,
    SalvageResult,
    StartCheck,
    database_at_start,
    restore_database,
    salvage_database,
)
from engine.errors import HearthError

log = logging.getLogger(__name__)


class _Job(QThread):
    """Runs one function off the UI thread; ``done`` carries its result or the HearthError it raised."""

    done = Signal(object)

    def __init__(self, fn: Callable[[], object], parent: QObject | None = None):
        super().__init__(parent)
        self._fn = fn

    def run(self) -> None:
        try:
            result = self._fn()
        except HearthError as exc:
            result = exc
        except Exception as exc:  # a bug: a plain message for the dialog, the traceback in the log
            log.exception("the database job failed")
            result = HearthError(f"unexpected failure: {exc}")
        self.done.emit(result)


def damage_text(check: StartCheck) -> str:
    """What happened, for someone who has never heard of SQLite."""
    detail = check.check.problem
    if check.backups:
        offer = ("Hearth keeps a backup copy of your conversations from each day it starts (the last three). "
                 "It can put the newest good copy back now: conversations from after that backup will be missing, "
                 "and the damaged file is kept aside, untouched, in case it can be rescued later.")
    else:
        offer = ("There is no backup to restore yet. Hearth can rescue every conversation that can still be read into "
                 "a new file; the damaged file is kept aside, untouched. Or quit, and keep a copy of the file first: "
                 "'hearth-cli db restore --from FILE' can put back a copy you made yourself.")
    return (f"The file that holds your conversations is damaged, so Hearth cannot open it.\n\n{offer}\n\n"
            f"File: {check.check.path}\nWhat SQLite reported: {detail}")


class DatabaseGuard(QObject):
    """``start()``; then ``passed`` (the store may be opened) or ``gave_up`` (the person chose to quit)."""

    passed = Signal()
    gave_up = Signal()
    restored = Signal(object)  # RestoreResult
    salvaged = Signal(object)  # SalvageResult

    def __init__(self, paths: HearthPaths, parent: QWidget | None = None):
        super().__init__(parent)
        self.paths = paths
        self.parent_widget = parent
        self.dialog: QMessageBox | None = None
        self.restore_button = None
        self.rescue_button = None
        self.report: QMessageBox | None = None  # what the rescue kept and lost
        self.result: StartCheck | None = None
        self._job: _Job | None = None

    def start(self) -> None:
        self._run(lambda: database_at_start(self.paths), self._checked)

    def _run(self, fn: Callable[[], object], then: Callable[[object], None]) -> None:
        self._job = _Job(fn, self)
        self._job.done.connect(then)
        self._job.start()

    def _checked(self, result: object) -> None:
        if isinstance(result, HearthError):  # the check itself failed: the store's own error will say why
            log.warning("the start-up database check failed: %s", result)
            self.passed.emit()
            return
        self.result = result
        if result.check.ok:
            self.passed.emit()
            return
        log.warning("the conversation database is damaged: %s", result.check.problem)
        self._show_dialog(result)

    def _show_dialog(self, result: StartCheck) -> None:
        box = QMessageBox(QMessageBox.Icon.Critical, "Hearth — conversations damaged", damage_text(result),
                          parent=self.parent_widget)
        if result.backups:
            self.restore_button = box.addButton("Restore the newest backup", QMessageBox.ButtonRole.AcceptRole)
            self.restore_button.clicked.connect(self._restore)
        else:
            self.rescue_button = box.addButton("Rescue what can be read", QMessageBox.ButtonRole.AcceptRole)
            self.rescue_button.clicked.connect(self._salvage)
        quit_button = box.addButton("Quit", QMessageBox.ButtonRole.RejectRole)
        quit_button.clicked.connect(self._quit)
        box.setDefaultButton(self.restore_button or self.rescue_button or quit_button)
        self.dialog = box
        box.show()

    def _restore(self) -> None:
        """The box closes with the click; it comes back only if the restore fails."""
        self._run(lambda: restore_database(self.paths), self._restored)

    def _restored(self, result: object) -> None:
        assert self.dialog is not None
        if isinstance(result, HearthError):
            self.dialog.setInformativeText(f"The backup could not be restored: {result}")
            self.dialog.show()
            return
        assert isinstance(result, RestoreResult)
        log.info("restored %s; damaged file kept as %s", result.source, result.damaged)
        self.restored.emit(result)
        self.passed.emit()

    def _salvage(self) -> None:
        """The box closes with the click; it comes back only if the rescue fails."""
        self._run(lambda: salvage_database(self.paths), self._salvaged)

    def _salvaged(self, result: object) -> None:
        assert self.dialog is not None
        if isinstance(result, HearthError):
            self.dialog.setInformativeText(f"The conversations could not be rescued: {result}")
            self.dialog.show()
            return
        assert isinstance(result, SalvageResult)
        log.info("salvaged the conversation database: %s", result.summary())
        self.report = QMessageBox(QMessageBox.Icon.Information, "Hearth — conversations rescued",
                                  f"Hearth {result.summary()}.", parent=self.parent_widget)
        self.report.show()
        self.salvaged.emit(result)
        self.passed.emit()

    def _quit(self) -> None:
        if self.dialog is not None:
            self.dialog.hide()
        self.gave_up.emit()

    def wait_job(self, timeout_ms: int = 60_000) -> None:
        """For shutdown: let a running check or restore finish before the thread object goes."""
        if self._job is not None:
            self._job.wait(timeout_ms)
