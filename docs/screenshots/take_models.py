"""Take the screenshots of the model library with the real catalog models (offscreen):

    QT_QPA_PLATFORM=offscreen python docs/screenshots/take_models.py [--data-dir .test-cache/home]

``--data-dir``'s ``models/`` should hold the catalog GGUFs (the test cache's home does). Writes
model-picker.png (a chat with the header's picker open) and models-dialog.png (the Models dialog with a
model selected) next to this file.
"""

from __future__ import annotations

import time

from shots import HERE, data_dir_arg, shot_config, wait_until


def main() -> None:
    models_home = data_dir_arg()
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow

    _app = QApplication.instance() or QApplication([])  # kept alive for the whole run
    config = shot_config(models_home)

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
