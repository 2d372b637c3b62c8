"""The attachments of the message being written: files offered (the paperclip, a drop, a paste) are read
on the reader's thread and counted on the engine thread; stored attachments (a new chat with the same
documents, a refused message given back) come in as they are, never read from disk again. The tray
(app/attachment_tray.py) shows them; ``attachments()`` is what Send passes in the ``TurnRequest``."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from PySide6.QtCore import QObject, QSettings, QTimer, Signal, Slot
from PySide6.QtWidgets import QFileDialog, QWidget

from app.attachment_reader import AttachmentReaderHost
from app.attachment_text import Total, total_text
from app.attachment_tray import AttachmentTray
from app.engine_worker import EngineHost
from app.text import display_safe
from engine.api import MAX_ATTACHMENTS, Attachment, attachment_block

log = logging.getLogger(__name__)
FOLDER_KEY = "attach_folder"  # where the paperclip's dialog opens: the folder files were last chosen from
NAME_FILTERS = ["Documents (*.txt *.md *.markdown *.csv *.tsv *.json *.html *.htm *.pdf *.docx *.py *.js *.ts *.c "
                "*.h *.cpp *.rs *.go *.java *.rb *.sh *.toml *.yaml *.yml *.xml *.log)", "All files (*)"]
TYPED_COUNT_MS = 300  # the typed text is counted this long after the last keystroke, not on each one

# (the model's context length or None, tokens the chat already holds, its context policy or None)
ContextFacts = Callable[[], tuple[int | None, int, str | None]]


@dataclass
class Draft:
    """One attachment of the message being written."""

    key: int
    name: str
    attachment: Attachment | None = None  # None while its file is being read
    tokens: int | None = None  # None until the engine thread has counted it


class ComposerAttachments(QObject):
    changed = Signal()  # an attachment came, went, was read or counted

    def __init__(self, tray: AttachmentTray, host: EngineHost, context: ContextFacts,
                 parent: QObject | None = None):
        super().__init__(parent)
        self.tray, self.host, self.context = tray, host, context
        self.reader = AttachmentReaderHost(self)
        self.reader.worker.read_done.connect(self._on_read)
        self.reader.worker.read_failed.connect(self._on_refused)
        host.worker.tokens_counted.connect(self._on_counted)
        tray.remove_requested.connect(self.remove)
        self.drafts: dict[int, Draft] = {}  # in the order they were attached
        self._keys = itertools.count(1)
        self._typed = ""
        self._typed_key = 0  # the key of the last count asked for the typed text (negative: never a draft's)
        self._typed_tokens = 0
        self._typed_timer = QTimer(self)
        self._typed_timer.setSingleShot(True)
        self._typed_timer.setInterval(TYPED_COUNT_MS)
        self._typed_timer.timeout.connect(self._count_typed)
        self._closed = False  # the window closed: late answers (a count, a read) change nothing

    # what the composer holds ---------------------------------------------------------------------------
    def attachments(self) -> tuple[Attachment, ...]:
        """The attachments read so far, in the order they were attached."""
        return tuple(d.attachment for d in self.drafts.values() if d.attachment is not None)

    @property
    def reading(self) -> list[str]:
        """Names of the files still being read."""
        return [d.name for d in self.drafts.values() if d.attachment is None]

    def _room(self) -> bool:
        if len(self.drafts) < MAX_ATTACHMENTS:
            return True
        self.tray.say_problem(f"A message holds at most {MAX_ATTACHMENTS} attachments: the rest were not attached.")
        return False

    # adding and removing ---------------------------------------------------------------------------------
    def offer_paths(self, paths: Iterable[str]) -> None:
        """Files the person chose, dropped or pasted: each gets a "reading…" chip and is read off this thread."""
        self.tray.say_problem("")
        for path in paths:
            if not self._room():
                break
            key = next(self._keys)
            name = path.replace("\\", "/").rsplit("/", 1)[-1]
            self.drafts[key] = Draft(key, name)
            self.tray.add_chip(key, name)
            self.reader.request_read.emit(key, path)
        self._changed()

    def choose_files(self, parent: QWidget, settings: QSettings | None) -> QFileDialog:
        """The paperclip's dialog (window-modal, opened without a nested loop), in the folder last used; the
        files chosen are offered, and their folder remembered in ``settings``."""
        folder = str(settings.value(FOLDER_KEY, "")) if settings is not None else ""
        dialog = QFileDialog(parent, "Attach files", folder)
        dialog.setObjectName("attachDialog")
        dialog.setFileMode(QFileDialog.FileMode.ExistingFiles)
        dialog.setNameFilters(NAME_FILTERS)

        def chosen(paths: list[str]) -> None:
            if paths and settings is not None:
                settings.setValue(FOLDER_KEY, dialog.directory().absolutePath())
            self.offer_paths(paths)

        dialog.filesSelected.connect(chosen)
        dialog.finished.connect(dialog.deleteLater)
        dialog.open()
        return dialog

    def add(self, attachments: Iterable[Attachment]) -> None:
        """Attachments already read (stored with a message): shown at once, counted on the engine thread."""
        self.tray.say_problem("")
        for attachment in attachments:
            if not self._room():
                break
            key = next(self._keys)
            self.drafts[key] = Draft(key, attachment.name, attachment)
            self.tray.add_chip(key, attachment.name)
            self._show_read(self.drafts[key])
            self._count(key, attachment)
        self._changed()

    @Slot(int)
    def remove(self, key: int) -> None:
        if self.drafts.pop(key, None) is not None:
            self.tray.remove_chip(key)
            self._changed()

    def clear(self) -> None:
        """The message was sent (or the composer emptied): no chips, no refusal left over."""
        for key in list(self.drafts):
            self.tray.remove_chip(key)
        self.drafts.clear()
        self.tray.say_problem("")
        self._changed()

    def recount(self) -> None:
        """Another model is loaded (its tokenizer differs): count every attachment again."""
        for draft in self.drafts.values():
            if draft.attachment is not None:
                draft.tokens = None
                self._show_read(draft)
                self._count(draft.key, draft.attachment)
        self.set_typed(self._typed)

    def shutdown(self) -> None:
        """The window is closing: no more counting, and the reader's thread ends."""
        self._closed = True
        self._typed_timer.stop()
        self.reader.stop()

    # the reader's and the engine's answers -----------------------------------------------------------------
    @Slot(int, object)
    def _on_read(self, key: int, attachment: Attachment) -> None:
        draft = self.drafts.get(key)
        if draft is None:
            return  # removed while it was being read
        if any(d.attachment == attachment for d in self.drafts.values()):  # the same file twice: once is enough
            self.remove(key)
            self.tray.add_problem(f"{display_safe(attachment.name)} is attached already.")
            return
        draft.attachment = attachment
        self._show_read(draft)
        self._count(key, attachment)
        self._changed()

    @Slot(int, str, str)
    def _on_refused(self, key: int, name: str, reason: str) -> None:
        """The file cannot be attached: its chip goes and the reason shows (the file's name made display-safe)."""
        if self.drafts.pop(key, None) is None:
            return
        self.tray.remove_chip(key)
        self.tray.add_problem(f"⚠ {display_safe(reason)}")  # "X cannot be attached: why" (engine/documents.py)
        log.info("attachment %s refused: %s", name, reason)
        self._changed()

    @Slot(int, object)
    def _on_counted(self, key: int, tokens: int | None) -> None:
        if key < 0:
            if key == self._typed_key:
                self._typed_tokens = tokens or 0
                self._changed()
            return
        draft = self.drafts.get(key)
        if draft is not None and tokens is not None:
            draft.tokens = tokens
            self._show_read(draft)
            self._changed()

    # counting -------------------------------------------------------------------------------------------------
    def _count(self, key: int, attachment: Attachment) -> None:
        """Tokens of the attachment as the message carries it (its name lines and text)."""
        self.host.request_count_tokens.emit(key, attachment_block(attachment))

    def set_typed(self, text: str) -> None:
        """The typed text changed: count it a moment after the typing stops (only while there are attachments)."""
        self._typed = text
        if self.drafts:
            self._typed_timer.start()

    def _count_typed(self) -> None:
        self._typed_key -= 1
        if self._typed.strip():
            self.host.request_count_tokens.emit(self._typed_key, self._typed)
        else:
            self._typed_tokens = 0
            self._changed()

    def _show_read(self, draft: Draft) -> None:
        chip = self.tray.chips.get(draft.key)
        a = draft.attachment
        if chip is not None and a is not None:
            chip.set_read(a.kind, a.size, a.pages, draft.tokens)

    def _changed(self) -> None:
        if self._closed:
            return
        if self.drafts and self._typed.strip() and self._typed_key == 0:
            self._typed_timer.start()  # the first attachment: the text typed before it counts too
        self.refresh_total()
        self.changed.emit()

    def refresh_total(self) -> None:
        """The total line: the message with its attachments against the model's context and the chat's use."""
        counted = [d.tokens for d in self.drafts.values() if d.attachment is not None]
        if not self.drafts:
            self.tray.set_total(None)
            return
        if self.reading or None in counted:
            self.tray.set_total(Total("Counting the tokens…", False))
            return
        limit, used, policy = self.context()
        self.tray.set_total(total_text(sum(counted) + self._typed_tokens, limit, used, policy))
