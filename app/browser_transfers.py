"""The browser's exports and imports: JSON and Markdown exports, bundles with saved context, and imports
with their progress dialog, Cancel, the question about chats already here and the one about trusting a
bundle's saved context.

Imports read and store on the import thread (app/import_worker.py); bundles' contexts are written and
installed on the engine thread. ``TransferFlow`` is a QObject on the UI thread so both threads' results
reach it queued; it renders into the browser's result line and dialogs.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt
from PySide6.QtWidgets import QFileDialog, QMessageBox, QProgressDialog, QWidget

from app.import_worker import BundleConversations, ImportHost, PendingImport
from app.text import plural
from engine.api import bundle_signed_here, export_json, export_markdown, to_document
from engine.errors import HearthError
from engine.types import BundleExported, BundleImported, CancelToken


def import_summary(result: BundleImported) -> str:
    """Which saved contexts an import used and which will be rebuilt, and why, in a sentence or two."""
    text = f"Saved context used for {plural(len(result.used), 'conversation')}" + (" (trusted by you)" if result.trusted
                                                                                      else "")
    if result.rebuilt:
        whys = sorted({result.notes.get(cid) or result.rebuilt[cid] for cid in result.rebuilt})
        text += f"; {len(result.rebuilt)} will be rebuilt when opened — " + "; ".join(whys)
    return text + "."


def duplicates_count(n: int, total: int) -> str:
    """The start of the duplicates question: "The conversation in this file is", "All 3 conversations in
    this file are", "2 of the 5 conversations in this file are" (never "1 of the 1 conversation")."""
    verb = "is" if n == 1 else "are"
    if n == total:
        return f"The conversation in this file {verb}" if n == 1 else f"All {n:,} conversations in this file {verb}"
    return f"{n:,} of the {plural(total, 'conversation')} in this file {verb}"


class TransferFlow(QObject):
    def __init__(self, browser: QWidget):
        """``browser``: the ``BrowserWindow`` it works for (its store, engine host, selection and result
        line); not imported here, so the browser's module stays the only one that names the other."""
        super().__init__(browser)
        self.browser = browser
        self._import_cancel: CancelToken | None = None
        self.import_progress: QProgressDialog | None = None
        self.importer = ImportHost(self)
        self.importer.worker.progress.connect(self._on_import_progress)
        self.importer.worker.finished.connect(self._on_imported)
        self.importer.worker.bundle_finished.connect(self._on_bundle_read)
        self.importer.worker.duplicates_found.connect(self._on_duplicates)
        self.duplicates_box: QMessageBox | None = None
        self._duplicates_choice: tuple[str, int] | None = None  # the last import's: policy, how many
        self._import_note = ""  # what the last import did with chats already here, for its result line
        self._bundle_trust: bool | None = None
        self.imported_ids: list[str] = []  # the last import's, for the status line and tests
        browser.host.worker.bundle_done.connect(self._on_bundle)

    def export_selected(self, path: str | None, kind: str) -> int:
        ids = self.browser.selected_ids() or self.browser.ids_shown()
        if not ids:
            return 0
        if path is None:
            suffix = "md" if kind == "md" else "json"
            path, _ = QFileDialog.getSaveFileName(self.browser, "Export conversations", f"conversations.{suffix}",
                                                  f"{suffix.upper()} (*.{suffix})")
            if not path:
                return 0
        try:
            n = (export_markdown if kind == "md" else export_json)(self.browser.store, ids, path)
        except OSError as exc:
            self.browser.warn(f"The export could not be written: {exc.strerror or exc}")
            return 0
        self.browser.verify_result.setText(f"Exported {plural(n, 'conversation')}.")
        return n

    def import_file(self, path: str | None, duplicates: str = "") -> bool:
        """Start importing a JSON export on the import thread, with a progress dialog and Cancel; the
        result (or the reason nothing was imported) arrives in ``_on_imported``. Conversations already
        here are skipped or copied as ``duplicates`` says ("skip", "copy"), or "" asks the person
        (``duplicates_question``). False if not started."""
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self.browser, "Import conversations", "", "Hearth export (*.json)")
            if not path:
                return False
        if not self._start_import_dialog("Importing conversations — Hearth"):
            return False
        self._duplicates_choice = None
        self.importer.start(self.browser.store.path, str(path), self._import_cancel, duplicates)
        return True

    def duplicates_question(self, pending: PendingImport) -> QMessageBox:
        """Skip the conversations already here, or import them as copies marked "(imported)"."""
        n, total = len(pending.duplicates), len(pending.conversations)
        names = ", ".join(f"“{t}”" for t in pending.titles[:3]) + (f" and {n - 3} more" if n > 3 else "")
        box = QMessageBox(QMessageBox.Icon.Question, "Conversations already here",
                          f"{duplicates_count(n, total)} already here (same id or same messages): {names}.\n\n"
                          "Skip them, or import them as copies titled “… (imported)” so you can tell them apart?",
                          QMessageBox.StandardButton.NoButton, self.browser)
        box.setObjectName("importDuplicates")
        box.setAccessibleName("Conversations already here")
        skip = box.addButton("Skip them", QMessageBox.ButtonRole.AcceptRole)
        skip.setObjectName("skip")
        copy = box.addButton("Import as copies", QMessageBox.ButtonRole.YesRole)
        copy.setObjectName("copy")
        cancel = box.addButton("Cancel import", QMessageBox.ButtonRole.RejectRole)
        cancel.setObjectName("cancel")
        box.setDefaultButton(skip)
        box.setEscapeButton(cancel)
        return box

    def _on_duplicates(self, pending: PendingImport) -> None:
        """The import thread read the file and found conversations already here: ask, then store."""
        if self._import_cancel is None or self._import_cancel.cancelled:
            self._on_imported(HearthError("the import was cancelled"))
            return
        if self.import_progress is not None:
            self.import_progress.hide()
        box = self.duplicates_box = self.duplicates_question(pending)

        def answered() -> None:
            self.duplicates_box = None
            choice = box.clickedButton().objectName() if box.clickedButton() is not None else "cancel"
            box.deleteLater()
            token = self._import_cancel
            if choice not in ("skip", "copy") or token is None:
                self._import_cancel = None
                self._on_imported([])  # closes the progress dialog
                self.browser.verify_result.setText("Nothing was imported.")
                return
            self._duplicates_choice = (choice, len(pending.duplicates))
            if self.import_progress is not None:
                self.import_progress.show()
            self.importer.store_pending(self.browser.store.path, pending, choice, token)

        box.finished.connect(answered)
        box.open()  # window-modal, not blocking the event loop

    def _start_import_dialog(self, title: str) -> bool:
        """The progress dialog with Cancel an import shows; False when one is already running."""
        if self._import_cancel is not None:
            self.browser.warn("An import is already running; wait for it or cancel it first.")
            return False
        self._import_cancel = token = CancelToken()
        dialog = QProgressDialog("Reading the file…", "Cancel", 0, 0, self.browser)
        dialog.setObjectName("importProgress")
        dialog.setWindowTitle(title)
        dialog.setWindowModality(Qt.WindowModality.WindowModal)
        dialog.setMinimumDuration(0)
        dialog.setAutoClose(False)
        dialog.setAutoReset(False)
        dialog.canceled.disconnect()  # by default Cancel hides the dialog at once; it stays until the rollback ends
        dialog.canceled.connect(lambda: self._cancel_import(token))
        dialog.show()
        self.import_progress = dialog
        self.browser.buttons["import"].setEnabled(False)
        return True

    def _cancel_import(self, token: CancelToken) -> None:
        token.cancel()
        if self.import_progress is not None:
            self.import_progress.setLabelText("Cancelling: removing what was imported so far…")
            self.import_progress.setCancelButton(None)

    def _on_import_progress(self, done: int, total: int) -> None:
        dialog = self.import_progress
        if dialog is None or self._import_cancel is None or self._import_cancel.cancelled:
            return
        dialog.setMaximum(max(1, total))
        dialog.setValue(done)
        dialog.setLabelText(f"Imported {done:,} of {plural(total, 'conversation')}…")

    def _on_imported(self, result: list[str] | HearthError) -> None:
        self._import_cancel = None
        self.browser.buttons["import"].setEnabled(True)
        if self.import_progress is not None:
            self.import_progress.close()
            self.import_progress.deleteLater()
            self.import_progress = None
        if isinstance(result, HearthError):  # TransferError and the rest: nothing was imported, says why
            self.browser.warn(f"Nothing was imported: {result}")
            return
        n = len(result)
        self._import_note = ""
        if self._duplicates_choice is not None:
            choice, dup = self._duplicates_choice
            self._import_note = (f"; skipped {dup:,} already here" if choice == "skip"
                                 else f", {dup:,} of them as copies marked “(imported)”")
        self.browser.verify_result.setText(f"Imported {plural(n, 'conversation')}{self._import_note}.")
        self.imported_ids = result
        self.browser.note_changed()
        if result:
            self.browser.check_contexts(full=False, ids=result)  # their Tokens and Context cells, without Verify all

    def export_bundle(self, path: str | None) -> bool:
        """Conversations and their saved context in one portable file (written on the engine thread)."""
        ids = self.browser.selected_ids() or self.browser.ids_shown()
        if not ids:
            return False
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self.browser, "Export with saved context", "conversations.hearth",
                                                  "Hearth bundle (*.hearth)")
            if not path:
                return False
        self.browser.verify_result.setText("Writing the bundle…")
        self.browser.host.request_export_bundle.emit(path, to_document(self.browser.store, ids), ids)
        return True

    def import_bundle(self, path: str | None, trust: bool | None = None, duplicates: str = "") -> bool:
        """Import a bundle: its conversations on the import thread (validated, in batches, all or nothing,
        with progress and Cancel, as a JSON import), then their saved contexts on the engine thread, each
        used only if this installation signed it (or ``trust``) and it verifies against this model.
        ``trust`` None: ask, when the bundle has context this installation did not sign. Chats already
        here: ``duplicates`` as for ``import_file``. The result lands in ``_on_bundle_read``; False if not
        started."""
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self.browser, "Import a bundle", "", "Hearth bundle (*.hearth)")
            if not path:
                return False
        if not self._start_import_dialog("Importing a bundle — Hearth"):
            return False
        self._bundle_trust = trust
        self._duplicates_choice = None
        self.importer.start_bundle(self.browser.store.path, str(path), self._import_cancel, duplicates)
        return True

    def _on_bundle_read(self, result: BundleConversations | HearthError) -> None:
        if isinstance(result, HearthError):
            self._on_imported(result)
            return
        self._on_imported(result.ids)  # stored: the progress dialog goes, the list shows them
        if not result.ids:
            return  # all skipped: no context to install, and the line says so
        trust = self._bundle_trust
        if trust is None:
            trust = bool(result.entries) and not bundle_signed_here(result.path, self.browser.host.config.paths) \
                and self.ask_trust()
        owners = {c["id"]: new for c, new in zip(result.conversations, result.ids, strict=True) if c["id"]}
        n = len(result.ids)
        self.browser.verify_result.setText(f"Imported {plural(n, 'conversation')}{self._import_note}; "
                                   "checking their saved context…")
        self.browser.host.request_import_bundle.emit(result.path, result.entries, owners, bool(trust))

    def trust_question(self) -> QMessageBox:
        """The plain warning before using saved context that another installation made."""
        box = QMessageBox(QMessageBox.Icon.Warning, "Use this bundle's saved context?",
                          "This bundle's saved context was not made by this Hearth.\n\n"
                          "Saved context is what the model remembers of a chat. It cannot be checked against the "
                          "chat's text: a forged one can make the model answer from a different conversation than "
                          "the one you see.\n\nUse it only if you trust whoever made this file. Otherwise Hearth "
                          "rebuilds it from the chat's text when you open the chat (slower, always safe).",
                          QMessageBox.StandardButton.NoButton, self.browser)
        box.setObjectName("bundleTrust")
        box.addButton("Rebuild (safe)", QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(box.buttons()[0])
        box.addButton("Trust and use it", QMessageBox.ButtonRole.AcceptRole)
        return box

    def ask_trust(self) -> bool:
        box = self.trust_question()
        box.exec()
        return box.buttonRole(box.clickedButton()) == QMessageBox.ButtonRole.AcceptRole

    def _on_bundle(self, result: BundleExported | BundleImported | HearthError) -> None:
        if isinstance(result, HearthError):
            self.browser.warn(str(result))
        elif isinstance(result, BundleExported):
            self.browser.verify_result.setText(f"Exported {plural(result.conversations, 'conversation')} with "
                                       f"{plural(result.contexts, 'saved context')}.")
        else:
            self.browser.verify_result.setText(import_summary(result) + self._duplicates_sentence())
            self.browser.check_contexts(full=False)

    def _duplicates_sentence(self) -> str:
        """After a bundle's contexts: what its import did with chats already here, as a sentence."""
        if self._duplicates_choice is None:
            return ""
        choice, n = self._duplicates_choice
        return (f" Skipped {n:,} already here." if choice == "skip"
                else f" {n:,} imported as copies marked “(imported)”.")

    def close(self) -> None:
        """The browser closes: an unanswered question imports nothing; a running import is cancelled (it
        removes what it added)."""
        if self.duplicates_box is not None:
            self.duplicates_box.reject()
        if self._import_cancel is not None:
            self._cancel_import(self._import_cancel)

    def shutdown(self) -> None:
        """End the import thread (a running import is cancelled and rolled back first)."""
        if self._import_cancel is not None:
            self._import_cancel.cancel()
        self.importer.stop()
