"""Take the screenshots of the model library with the real catalog models (offscreen):

    QT_QPA_PLATFORM=offscreen python docs/screenshots/take_models.py [--data-dir .test-cache/home]

``--data-dir``'s ``models/`` should hold the catalog GGUFs (the test cache's home does). Writes
model-picker.png (a chat with the header's picker open) and models-dialog.png (the Models dialog with a
model selected) next to this file.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=str(ROOT / ".test-cache" / "home"))
    args = ap.parse_args()
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from app.config import AppConfig
    from app.main_window import MainWindow
    from engine.api import resolve_paths

    _app = QApplication.instance() or QApplication([])  # kept alive for the whole run
    home = Path(tempfile.mkdtemp(prefix="hearth-shots-"))
    for sub in ("models", "converted"):
        (home / sub).symlink_to(Path(args.data_dir).resolve() / sub)
    config = AppConfig(resolve_paths(home).ensure(), weights="int4", provider="cpu")

    def wait_until(cond, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                raise TimeoutError
            loop = QEventLoop()
            QTimer.singleShot(10, loop.quit)
            loop.exec()

    w = MainWindow(config)
    w.resize(1100, 720)
    w.show()
    wait_until(lambda: w.model_info is not None and len(w.models.models) >= 2)
    w.store.set_settings(w.new_chat(), {"temperature": 0.0, "max_new_tokens": 40})
    w.composer.setPlainText("Suggest a name for a cosy reading corner.")
    w.composer.submit()
    wait_until(lambda: not w.turns.running(w.current))
    w.models.picker.showPopup()
    wait_until(lambda: True, 0.5)
    time.sleep(0.3)
    shot = w.grab()
    popup = w.models.picker.view().window()
    if popup.isVisible():  # the open list is its own top-level window: paint it where it shows
        from PySide6.QtGui import QPainter

        painter = QPainter(shot)
        painter.drawPixmap(w.mapFromGlobal(popup.mapToGlobal(popup.rect().topLeft())), popup.grab())
        painter.end()
    shot.save(str(HERE / "model-picker.png"))
    w.models.picker.hidePopup()
    w.models.show_dialog()
    d = w.models.dialog
    wait_until(lambda: d.table.rowCount() >= 2)
    d.table.selectRow(1)
    wait_until(lambda: True, 0.3)
    d.grab().save(str(HERE / "models-dialog.png"))
    w.close()
    print("wrote model-picker.png and models-dialog.png")


if __name__ == "__main__":
    main()
