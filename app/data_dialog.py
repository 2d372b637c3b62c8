"""Help → Where is my data?: each place Hearth keeps something, with buttons to copy its path and
open its folder. Paths are elided in the middle (the full path is the tooltip), so nothing wraps
mid-word."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QGridLayout,
    QLabel,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

PATH_WIDTH = 460  # px given to a path before it is elided


class ElidedPath(QLabel):
    """A path shown in one line, shortened in the middle when it does not fit."""

    def __init__(self, path: Path, parent: QWidget | None = None):
        super().__init__(parent)
        self.path = str(path)
        self.setToolTip(self.path)
        self.setAccessibleName(self.path)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setMinimumWidth(PATH_WIDTH)
        self._elide()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        self.setText(self.fontMetrics().elidedText(self.path, Qt.TextElideMode.ElideMiddle, max(self.width(), 80)))


def open_folder(folder: Path, parent: QWidget) -> bool:
    """Show ``folder`` in the file manager; a folder that is gone (or cannot be opened) says so."""
    if not folder.is_dir():
        _problem(parent, f"The folder {folder} does not exist (yet): Hearth creates it when it first needs it.")
        return False
    if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder))):
        _problem(parent, f"No file manager could open {folder}. Copy the path and open it yourself.")
        return False
    return True


def _problem(parent: QWidget, text: str) -> None:
    from PySide6.QtWidgets import QMessageBox

    box = QMessageBox(QMessageBox.Icon.Warning, "Cannot open the folder", text, QMessageBox.StandardButton.Ok, parent)
    box.setObjectName("folder-problem")
    box.open()


class DataLocationsDialog(QDialog):
    """``places``: (what, path, note); a path that is a file gets its folder opened."""

    def __init__(self, places: list[tuple[str, Path, str]], parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Where Hearth keeps your data")
        self.setAccessibleName("Where Hearth keeps your data")
        layout = QVBoxLayout(self)
        grid = QGridLayout()
        grid.setColumnStretch(1, 1)
        self.paths: list[ElidedPath] = []
        self.copy_buttons: list[QPushButton] = []
        self.open_buttons: list[QPushButton] = []
        for row, (what, path, note) in enumerate(places):
            label = QLabel(f"<b>{what}</b>" + (f"<br><small>{note}</small>" if note else ""))
            grid.addWidget(label, row, 0)
            shown = ElidedPath(path)
            grid.addWidget(shown, row, 1)
            copy = QPushButton("Copy")
            copy.setToolTip(f"Copy {path}")
            copy.setAccessibleName(f"Copy the path of {what}")
            copy.clicked.connect(lambda _=False, p=str(path): QGuiApplication.clipboard().setText(p))
            grid.addWidget(copy, row, 2)
            folder = path if path.suffix == "" or path.is_dir() else path.parent
            opener = QPushButton("Open folder")
            opener.setToolTip(f"Show {folder} in the file manager")
            opener.setAccessibleName(f"Open the folder of {what}")
            opener.clicked.connect(lambda _=False, f=folder: open_folder(f, self))
            grid.addWidget(opener, row, 3)
            self.paths.append(shown)
            self.copy_buttons.append(copy)
            self.open_buttons.append(opener)
        layout.addLayout(grid)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
