"""Reading attached files off the UI thread: ``AttachmentReader`` lives on a QThread of its own (not the
engine's, so a long PDF never holds up a reply) and extracts each file with ``engine.api.read_attachment``.
Counting an attachment's tokens needs the loaded model, so it goes to the engine thread
(``EngineHost.request_count_tokens``). A file that cannot be read comes back as its reason in words."""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

from PySide6.QtCore import QObject, QThread, Signal, Slot

from engine.api import AttachmentError, read_attachment

log = logging.getLogger(__name__)


class AttachmentReader(QObject):
    read_done = Signal(int, object)  # key, Attachment
    read_failed = Signal(int, str, str)  # key, the file's name, why it was refused

    @Slot(int, str)
    def read(self, key: int, path: str) -> None:
        name = Path(path).name
        try:
            attachment = read_attachment(Path(path))
        except AttachmentError as exc:  # its message names the file and says why (and the cap, for a cap)
            self.read_failed.emit(key, name, str(exc))
        except OSError as exc:
            self.read_failed.emit(key, name, f"{name} could not be read: {exc.strerror or exc}")
        except Exception as exc:  # a bug: the traceback goes to the log, the person gets words
            log.error("reading %s failed:\n%s", path, traceback.format_exc())
            self.read_failed.emit(key, name, f"{name} could not be read: {exc}")
        else:
            self.read_done.emit(key, attachment)


class AttachmentReaderHost(QObject):
    """Owns the reader's thread; ``request_read`` is queued to it, so files are read in the order given."""

    request_read = Signal(int, str)  # key, path

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("hearth-attachments")
        self.worker = AttachmentReader()
        self.worker.moveToThread(self.thread)
        self.request_read.connect(self.worker.read)
        self.thread.start()

    def stop(self, timeout_ms: int = 10000) -> bool:
        """Let the file being read finish and end the thread; True if it did in time."""
        self.thread.quit()
        return self.thread.wait(timeout_ms)
