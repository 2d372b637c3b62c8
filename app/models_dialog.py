"""The Models dialog: every model Hearth knows, its facts and memory estimate; download, add, remove, use.

It shows what the library worker lists (app/library_worker.py) and asks it to act; nothing here reads a
file or the network. A download shows its progress, speed and time left, can be cancelled, and a failed
one can be retried: the engine resumes from the bytes already fetched.
"""

from __future__ import annotations

from html import escape

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.hub_panel import HubPanel
from app.hub_worker import HubHost
from app.library_worker import LibraryHost
from app.models_meter import SPEED_WINDOW_S, DownloadMeter  # noqa: F401 - where the tests and others find them
from app.remote_servers import RemoteServersPanel
from app.remote_worker import RemoteHost
from app.text import byte_size, count, display_safe, quant_label
from app.theme import error_colour
from engine.types import LibraryModel

COLUMNS = ("Model", "Status", "Architecture", "Parameters", "Quantization", "File", "Context", "Memory")


def status_text(m: LibraryModel) -> str:
    if m.status == "ready":
        return "ready" + ("" if m.converted else " (converts on first use)")
    return m.status


def memory_text(m: LibraryModel) -> str:
    if not m.ram_weights_bytes:
        return "—"
    return f"{byte_size(m.ram_weights_bytes + (m.ram_kv_bytes or 0))}"


class ModelsDialog(QDialog):
    use_requested = Signal(str)  # run the open chat (and new chats) on this model
    context_requested = Signal(str, int)  # a model's context length (0: automatic)

    def __init__(self, library: LibraryHost, parent: QWidget | None = None, current: str | None = None,
                 remotes: RemoteHost | None = None, hub: HubHost | None = None):
        super().__init__(parent)
        self.library = library
        self.remotes, self.hub = remotes, hub
        self.servers: RemoteServersPanel | None = None
        self.hub_panel: HubPanel | None = None
        self.current = current  # the model the open chat runs
        self.models: dict[str, LibraryModel] = {}
        self.downloads: dict[str, DownloadMeter] = {}
        self.failed: dict[str, str] = {}
        self.setWindowTitle("Models")
        self.setAccessibleName("Models")
        self.resize(980, 520)
        self._build()
        w = library.worker
        w.listed.connect(self.show_models)
        w.download_progress.connect(self._on_progress)
        w.download_done.connect(self._on_download_done)
        w.changed.connect(self._on_changed)
        library.request_refresh.emit()

    def _build(self) -> None:
        outer = QVBoxLayout(self)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        outer.addWidget(self.tabs, 1)
        local = QWidget()
        self.tabs.addTab(local, "On this computer")
        if self.remotes is not None:
            self.servers = RemoteServersPanel(self.remotes)
            self.servers.use_requested.connect(self._use_remote)
            self.tabs.addTab(self.servers, "Servers")
        if self.hub is not None:
            self.hub_panel = HubPanel(self.hub)
            self.hub_panel.installed.connect(lambda _m: self.library.request_refresh.emit())
            self.hub_panel.use_requested.connect(self._use_remote)
            self.tabs.addTab(self.hub_panel, "Hugging Face")
        layout = QVBoxLayout(local)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setAccessibleName("Models Hearth knows")
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for col in range(1, len(COLUMNS)):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        self.table.itemSelectionChanged.connect(self._show_details)
        self.table.itemDoubleClicked.connect(lambda _item: self._use())
        layout.addWidget(self.table, 1)
        self.details = QLabel("")
        self.details.setWordWrap(True)
        self.details.setTextFormat(Qt.TextFormat.RichText)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details.setMinimumHeight(90)
        self.details.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.details)
        context_row = QHBoxLayout()
        context_row.addWidget(QLabel("Context length:"))
        self.context = QSpinBox()
        self.context.setAccessibleName("Context length in tokens")
        self.context.setSingleStep(1024)
        self.context.setSuffix(" tokens")
        self.context.setToolTip("How much of the conversation the model reads. More needs more memory; "
                                "automatic is the model's own, capped to fit the free memory.")
        context_row.addWidget(self.context)
        self.context_apply = QPushButton("Apply")
        self.context_apply.clicked.connect(self._apply_context)
        context_row.addWidget(self.context_apply)
        self.context_note = QLabel("")
        self.context_note.setEnabled(False)  # a note, not a control
        context_row.addWidget(self.context_note, 1)
        layout.addLayout(context_row)
        self.progress = QProgressBar()
        self.progress.setAccessibleName("Download progress")
        self.progress.hide()
        self.progress_text = QLabel("")
        self.progress_text.hide()
        layout.addWidget(self.progress)
        layout.addWidget(self.progress_text)
        self.message = QLabel("")
        self.message.setWordWrap(True)
        self.message.setStyleSheet(f"color: {error_colour(self.palette())};")
        self.message.hide()
        layout.addWidget(self.message)
        row = QHBoxLayout()
        self.add_button = QPushButton("Add model file…")
        self.add_button.setToolTip("Use a GGUF file you already have (it stays where it is)")
        self.download_button = QPushButton("Download")
        self.cancel_button = QPushButton("Cancel download")
        self.remove_button = QPushButton("Remove")
        self.use_button = QPushButton("Use for this chat")
        self.use_button.setDefault(True)
        close = QPushButton("Close")
        for b in (self.add_button, self.download_button, self.cancel_button, self.remove_button):
            row.addWidget(b)
        row.addStretch(1)
        row.addWidget(self.use_button)
        layout.addLayout(row)
        bottom = QHBoxLayout()
        bottom.addStretch(1)
        bottom.addWidget(close)
        outer.addLayout(bottom)
        self.add_button.clicked.connect(self._add)
        self.download_button.clicked.connect(self._download)
        self.cancel_button.clicked.connect(self._cancel)
        self.remove_button.clicked.connect(self._remove)
        self.use_button.clicked.connect(self._use)
        close.clicked.connect(self.accept)
        self._update_buttons()

    # what is shown -----------------------------------------------------------------------------------------
    def show_models(self, models: list) -> None:
        selected = self.selected_name()
        self.models = {m.name: m for m in models}
        self.table.setRowCount(len(models))
        for row, m in enumerate(models):
            name = m.title + (" (default for new chats)" if m.is_default else "")
            cells = (name, status_text(m), m.architecture or "—", str(m.parameters or "—"), m.quant or quant_label(m.quant_mix),
                     byte_size(m.file_bytes) if m.file_bytes else "—",
                     count(m.chosen_context or m.context_length) if (m.chosen_context or m.context_length) else "—",
                     memory_text(m))
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setData(Qt.ItemDataRole.UserRole, m.name)
                if m.problem:
                    item.setToolTip(m.problem)
                self.table.setItem(row, col, item)
        if selected is None and self.current in self.models:
            selected = self.current
        for row in range(self.table.rowCount()):
            if self.table.item(row, 0).data(Qt.ItemDataRole.UserRole) == selected:
                self.table.selectRow(row)
        self._show_details()

    def selected_name(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        return self.table.item(rows[0].row(), 0).data(Qt.ItemDataRole.UserRole) if rows else None

    def selected(self) -> LibraryModel | None:
        name = self.selected_name()
        return self.models.get(name) if name else None

    def _show_details(self) -> None:
        m = self.selected()
        self._update_buttons()
        self._show_context(m)
        if m is None:
            self.details.setText("Select a model to see its details.")
            return
        lines = [f"<b>{escape(m.title)}</b> — <code>{escape(m.name)}</code>"]
        if m.description:
            lines.append(escape(m.description))
        red = error_colour(self.palette())
        if m.problem:
            lines.append(f"<span style='color:{red}'>{escape(m.problem)}</span>")
        facts = []
        if m.ram_weights_bytes:
            context = m.chosen_context or m.context_length
            facts.append(f"memory: about {byte_size(m.ram_weights_bytes)} for the weights"
                         + (f" + {byte_size(m.ram_kv_bytes)} for {count(context)} tokens of context"
                            if m.ram_kv_bytes else ""))
        if m.license:
            facts.append(f"licence: {escape(m.license)}")
        if m.path:
            facts.append(f"file: {escape(display_safe(m.path))}")  # the path stays exact in the entry
        facts.append({"catalog": "from Hearth's catalog", "added": "a file you added (it stays where it is)",
                      "folder": "found in your models folder"}.get(m.source, m.source))
        lines.append(" · ".join(facts))
        if m.name in self.failed:
            lines.append(f"<span style='color:{red}'>The last download failed: {escape(self.failed[m.name])}. "
                         "Download again to resume where it stopped.</span>")
        self.details.setText("<br>".join(lines))

    def _show_context(self, m: LibraryModel | None) -> None:
        """The context length control: 0 shows as "automatic" (the model's own, capped to fit memory)."""
        usable = m is not None and bool(m.context_length)
        for widget in (self.context, self.context_apply):
            widget.setEnabled(usable)
        if not usable:
            self.context_note.setText("")
            return
        self.context.blockSignals(True)
        self.context.setRange(0, m.context_length)
        self.context.setSpecialValueText(f"automatic ({count(m.chosen_context or m.context_length)} tokens)")
        self.context.setValue(m.context_setting or 0)
        self.context.blockSignals(False)
        kv = f"; its saved context needs about {byte_size(m.ram_kv_bytes)} of memory" if m.ram_kv_bytes else ""
        self.context_note.setText(f"the model reads up to {count(m.context_length)} tokens{kv}")

    def _apply_context(self) -> None:
        m = self.selected()
        if m is not None:
            self.context_requested.emit(m.name, self.context.value())

    def _update_buttons(self) -> None:
        m = self.selected()
        downloading = m is not None and m.name in self.downloads
        self.download_button.setVisible(m is not None and m.source == "catalog" and m.status == "not downloaded"
                                        and not downloading)
        self.download_button.setText("Resume download" if m is not None and m.name in self.failed else "Download")
        self.cancel_button.setVisible(downloading)
        self.remove_button.setEnabled(m is not None and m.status != "not downloaded" and not downloading
                                      and m.source != "folder")
        self.remove_button.setToolTip("Files in your models folder are removed by moving them out of the folder"
                                      if m is not None and m.source == "folder" else "")
        self.use_button.setEnabled(m is not None and m.status == "ready")

    # actions --------------------------------------------------------------------------------------------------
    def _download(self) -> None:
        m = self.selected()
        if m is None:
            return
        self.failed.pop(m.name, None)
        self.downloads[m.name] = DownloadMeter()
        self.progress.setRange(0, 0)
        self.progress.show()
        self.progress_text.setText(f"Downloading {m.title}…")
        self.progress_text.show()
        self.message.hide()
        self.library.download(m.name)
        self._update_buttons()

    def _cancel(self) -> None:
        m = self.selected()
        if m is not None:
            self.library.cancel_download(m.name)

    def _on_progress(self, name: str, done: int, total: int) -> None:
        meter = self.downloads.get(name)
        if meter is None:
            return
        meter.add(done)
        unit = 1 << 20 if total >= 1 << 31 else 1  # QProgressBar counts in 32-bit ints
        self.progress.setRange(0, max(total // unit, 1) if total else 0)
        self.progress.setValue(done // unit)
        title = self.models[name].title if name in self.models else name
        self.progress_text.setText(f"Downloading {title}: {meter.describe(done, total)}")

    def _on_download_done(self, name: str, problem: str) -> None:
        self.downloads.pop(name, None)
        if not self.downloads:
            self.progress.hide()
        if problem:
            self.failed[name] = problem
            self.progress_text.setText(f"The download stopped: {problem}")
        else:
            self.progress_text.setText("Downloaded and verified.")
        self._show_details()

    def _on_changed(self, what: str, problem: str) -> None:
        if problem:
            self.message.setText(problem)
            self.message.show()
        else:
            self.message.hide()

    def _add(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Add a model file", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.library.request_add.emit(path)

    def _remove(self) -> None:
        m = self.selected()
        if m is not None:
            self.library.request_remove.emit(m.name)

    def _use(self) -> None:
        m = self.selected()
        if m is not None and m.status == "ready":
            self.use_requested.emit(m.name)
            self.current = m.name

    def _use_remote(self, key: str) -> None:
        """A remote server's model (NAME/MODEL), or one just downloaded from the Hub, for the open chat."""
        self.use_requested.emit(key)
        self.current = key
