"""The Models dialog's "Hugging Face" tab: search GGUF repositories, see a repository's GGUF files (size,
quantization, memory estimate; a split GGUF as one file) and download one into the library with its
progress, speed, Cancel, and a retry that resumes; an access token for gated repositories.

It asks the hub worker (app/hub_worker.py) for everything: nothing here touches the network or a file.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.hub_worker import HubHost
from app.models_meter import DownloadMeter
from app.text import byte_size, count, display_safe, plural
from app.theme import error_colour

REPO_COLUMNS = ("Repository", "Downloads", "Likes", "Access")
FILE_COLUMNS = ("File", "Quantization", "Size", "Memory")


def file_title(f) -> str:
    """A split GGUF is one file to the person: its first part's name without the -00001-of-0000N."""
    return display_safe(f.filename) + (f" (one model in {len(f.parts)} parts)" if len(f.parts) > 1 else "")


def _table(columns: tuple[str, ...], name: str) -> QTableWidget:
    table = QTableWidget(0, len(columns))
    table.setHorizontalHeaderLabels(columns)
    table.setAccessibleName(name)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.verticalHeader().hide()
    table.setAlternatingRowColors(True)
    header = table.horizontalHeader()
    header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    for col in range(1, len(columns)):
        header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
    return table


def _number(n: int) -> QTableWidgetItem:
    item = QTableWidgetItem(count(n))
    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return item


class HubPanel(QWidget):
    installed = Signal(object)  # LibraryModel: the library lists it now
    use_requested = Signal(str)  # the model just downloaded, for the open chat

    def __init__(self, hub: HubHost, parent: QWidget | None = None):
        super().__init__(parent)
        self.hub = hub
        self.repos: list = []
        self.files: list = []
        self.repo: str | None = None  # whose files are listed
        self.downloading = None  # the HubFile being downloaded
        self.last_failed = None  # the HubFile whose download failed or was cancelled: Retry resumes it
        self.meter = DownloadMeter()
        self._build()
        w = hub.worker
        w.found.connect(self._on_found)
        w.files_listed.connect(self._on_files)
        w.progress.connect(self._on_progress)
        w.installed.connect(self._on_installed)
        w.failed.connect(self._on_failed)
        w.token_state.connect(self._on_token_state)
        hub.request_token_state.emit()

    def _build(self) -> None:
        layout = QVBoxLayout(self)
        search_row = QHBoxLayout()
        self.query = QLineEdit()
        self.query.setPlaceholderText("Search GGUF models on Hugging Face, e.g. qwen2.5 0.5b instruct")
        self.query.setAccessibleName("Search the Hugging Face Hub")
        self.query.setClearButtonEnabled(True)
        self.query.returnPressed.connect(self.search)
        self.search_button = QPushButton("Search")
        self.search_button.clicked.connect(self.search)
        search_row.addWidget(self.query, 1)
        search_row.addWidget(self.search_button)
        layout.addLayout(search_row)
        self.repo_table = _table(REPO_COLUMNS, "GGUF repositories found")
        self.repo_table.itemSelectionChanged.connect(self._list_files)
        layout.addWidget(self.repo_table, 3)
        self.files_label = QLabel("Select a repository to see its GGUF files.")
        self.files_label.setEnabled(False)
        layout.addWidget(self.files_label)
        self.file_table = _table(FILE_COLUMNS, "The repository's GGUF files")
        self.file_table.itemSelectionChanged.connect(self._update_buttons)
        self.file_table.itemDoubleClicked.connect(lambda _item: self.download())
        layout.addWidget(self.file_table, 2)
        self.progress = QProgressBar()
        self.progress.setAccessibleName("Download progress")
        self.progress.hide()
        layout.addWidget(self.progress)
        self.progress_text = QLabel("")
        self.progress_text.setAccessibleName("Download status")
        self.progress_text.setWordWrap(True)
        self.progress_text.hide()
        layout.addWidget(self.progress_text)
        self.message = QLabel("")
        self.message.setWordWrap(True)
        self.message.setStyleSheet(f"color: {error_colour(self.palette())};")
        self.message.setAccessibleName("Hugging Face problem")
        self.message.hide()
        layout.addWidget(self.message)
        token_row = QHBoxLayout()
        token_row.addWidget(QLabel("Access token:"))
        self.token = QLineEdit()
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        self.token.setPlaceholderText("hf_… (for gated repositories)")
        self.token.setAccessibleName("Hugging Face access token")
        self.token.setToolTip("Kept in the system's keyring (or a private file); sent only to the Hub")
        self.save_token = QPushButton("Save token")
        self.forget_token = QPushButton("Forget token")
        self.token_note = QLabel("")
        self.token_note.setEnabled(False)
        token_row.addWidget(self.token, 1)
        token_row.addWidget(self.save_token)
        token_row.addWidget(self.forget_token)
        token_row.addWidget(self.token_note)
        layout.addLayout(token_row)
        row = QHBoxLayout()
        row.addStretch(1)
        self.download_button = QPushButton("Download")
        self.cancel_button = QPushButton("Cancel download")
        self.retry_button = QPushButton("Retry download")
        self.retry_button.setToolTip("Resumes from the bytes already fetched")
        self.use_button = QPushButton("Use for this chat")
        self.use_button.setToolTip("Run the open chat on the model just downloaded")
        self.use_button.clicked.connect(self._use)
        self.installed_model = None  # the last model downloaded
        for b in (self.use_button, self.retry_button, self.cancel_button, self.download_button):
            row.addWidget(b)
        layout.addLayout(row)
        self.save_token.clicked.connect(self._save_token)
        self.forget_token.clicked.connect(self.hub.request_clear_token)
        self.download_button.clicked.connect(self.download)
        self.cancel_button.clicked.connect(self.hub.cancel)
        self.retry_button.clicked.connect(self.retry)
        self._update_buttons()

    # searching and listing ------------------------------------------------------------------------------
    def search(self) -> None:
        query = self.query.text().strip()
        if not query:
            self._problem("Type part of a model's name to search for.")
            return
        self.message.hide()
        self.search_button.setEnabled(False)
        self.search_button.setText("Searching…")
        self.hub.request_search.emit(query)

    def _on_found(self, query: str, repos: list) -> None:
        self._search_done()
        self.repos = repos
        self.repo_table.setRowCount(len(repos))
        for row, r in enumerate(repos):
            name = QTableWidgetItem(display_safe(r.id))
            name.setData(Qt.ItemDataRole.UserRole, r.id)
            self.repo_table.setItem(row, 0, name)
            self.repo_table.setItem(row, 1, _number(r.downloads))
            self.repo_table.setItem(row, 2, _number(r.likes))
            self.repo_table.setItem(row, 3, QTableWidgetItem("gated: needs a token" if r.gated else "open"))
        if not repos:
            self._problem(f"No GGUF repositories match {display_safe(query)!r}.")
        self.files_label.setText(f"{plural(len(repos), 'repository', 'repositories')} found. "
                                 "Select one to see its GGUF files.")

    def _search_done(self) -> None:
        self.search_button.setEnabled(True)
        self.search_button.setText("Search")

    def selected_repo(self) -> str | None:
        rows = self.repo_table.selectionModel().selectedRows()
        return self.repo_table.item(rows[0].row(), 0).data(Qt.ItemDataRole.UserRole) if rows else None

    def _list_files(self) -> None:
        repo = self.selected_repo()
        if repo is None or repo == self.repo:
            return
        self.repo = repo
        self.files = []
        self.file_table.setRowCount(0)
        self.files_label.setText(f"Listing the GGUF files of {display_safe(repo)}…")
        self.hub.request_files.emit(repo)
        self._update_buttons()

    def _on_files(self, repo: str, files: list) -> None:
        if repo != self.repo:
            return
        self.message.hide()
        self.files = files
        self.file_table.setRowCount(len(files))
        for row, f in enumerate(files):
            self.file_table.setItem(row, 0, QTableWidgetItem(file_title(f)))
            self.file_table.setItem(row, 1, QTableWidgetItem(f.quant or "—"))
            self.file_table.setItem(row, 2, QTableWidgetItem(byte_size(f.size) if f.size else "—"))
            memory = QTableWidgetItem(f"about {byte_size(f.memory_bytes)}" if f.memory_bytes else "—")
            memory.setToolTip("The memory the model needs to run, estimated from the file")
            self.file_table.setItem(row, 3, memory)
        self.files_label.setText(f"{display_safe(repo)}: {plural(len(files), 'GGUF file')}"
                                 if files else f"{display_safe(repo)} has no GGUF files.")
        self._update_buttons()

    def selected_file(self):
        rows = self.file_table.selectionModel().selectedRows()
        return self.files[rows[0].row()] if rows and rows[0].row() < len(self.files) else None

    # downloading ----------------------------------------------------------------------------------------
    def download(self, file=None) -> None:
        file = file or self.selected_file()
        if file is None or self.downloading is not None:
            return
        self.downloading, self.last_failed, self.installed_model = file, None, None
        self.meter = DownloadMeter()
        self.message.hide()
        self.progress.setRange(0, 0)
        self.progress.show()
        self.progress_text.setText(f"Downloading {file_title(file)}…")
        self.progress_text.show()
        self.hub.install(file)
        self._update_buttons()

    def retry(self) -> None:
        if self.last_failed is not None:
            self.download(self.last_failed)

    def _on_progress(self, p) -> None:
        if self.downloading is None:
            return
        self.meter.add(p.done_bytes)
        total = p.total_bytes or 0
        unit = 1 << 20 if total >= 1 << 31 else 1  # QProgressBar counts in 32-bit ints
        self.progress.setRange(0, max(total // unit, 1) if total else 0)
        self.progress.setValue(p.done_bytes // unit)
        part = f" (part {p.part} of {p.parts})" if p.parts > 1 else ""
        self.progress_text.setText(f"Downloading {display_safe(p.filename)}{part}: "
                                   f"{self.meter.describe(p.done_bytes, total)}")

    def _on_installed(self, model) -> None:
        file, self.downloading = self.downloading, None
        self.progress.hide()
        name = file_title(file) if file is not None else model.title
        self.progress_text.setText(f"Downloaded {name}: it is in the list of models on this computer as "
                                   f"{model.title}.")
        self.installed_model = model if model.status == "ready" else None
        self._update_buttons()
        self.installed.emit(model)

    def _on_failed(self, what: str, kind: str, message: str) -> None:
        if what == "search":
            self._search_done()
        if what == "files":
            self.files_label.setText("The repository's files could not be listed.")
        if what == "download":
            self.last_failed, self.downloading = self.downloading, None
            self.progress.hide()
            self.progress_text.setText("The download stopped." if kind != "cancelled" else "Download cancelled.")
        self._problem(message)
        self._update_buttons()

    def _problem(self, message: str) -> None:
        self.message.setText(message)
        self.message.show()

    # the token ------------------------------------------------------------------------------------------
    def _save_token(self) -> None:
        token = self.token.text().strip()
        if not token:
            self._problem("Paste an access token first (huggingface.co/settings/tokens).")
            return
        self.hub.request_set_token.emit(token)
        self.token.clear()  # the secret store has it now

    def _on_token_state(self, has: bool) -> None:
        self.token_note.setText("a token is saved" if has else "no token saved")
        self.forget_token.setEnabled(has)

    def _use(self) -> None:
        if self.installed_model is not None:
            self.use_requested.emit(self.installed_model.name)

    def _update_buttons(self) -> None:
        busy = self.downloading is not None
        self.use_button.setVisible(not busy and self.installed_model is not None)
        self.download_button.setEnabled(not busy and self.selected_file() is not None)
        self.cancel_button.setVisible(busy)
        self.retry_button.setVisible(not busy and self.last_failed is not None)
