"""The conversation browser's screenshots with the real default model, under a real X server:

    xvfb-run -a -s "-screen 0 1400x900x24" env QT_QPA_PLATFORM=xcb python docs/screenshots/take_browser.py

Writes browser.png (a search, newest activity first, one chat whose saved context Verify all found
damaged: the same word in its row, the preview and the main window's sidebar) and
import-duplicates.png (importing a file whose chats are already here asks: skip, or import as copies).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from shots import HERE, data_dir_arg, settle, shot_config, wait_until


def main() -> None:
    models_home = data_dir_arg()
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from engine.checkpoint.store import conversation_key

    app = QApplication.instance() or QApplication([])
    config = shot_config(models_home)

    w = MainWindow(config)
    w.resize(1100, 720)
    w.show()
    wait_until(lambda: w.model_info is not None)
    chats = []
    for text in ("How long is the Nile river?", "What is the largest river delta in Europe?",
                 "Write a haiku about a river at night.", "Give me three tips for sleeping better."):
        chats.append(w.new_chat())
        w.store.set_settings(w.current, {"temperature": 0.0, "max_new_tokens": 60})
        w.composer.setPlainText(text)
        w.composer.submit()
        wait_until(lambda: not w.turns.running(w.current))
    w.new_chat()  # the last chat is saved to disk too
    wait_until(lambda: w.sidebar.badge(chats[-1]) == "saved")
    damaged = next(config.paths.checkpoints.glob(f"{conversation_key(chats[1])}-*.hkv"))
    data = bytearray(damaged.read_bytes())
    data[-7] ^= 0x01
    damaged.write_bytes(bytes(data))

    w.show_browser()
    b = w.browser
    b.move(20, 20)
    wait_until(lambda: b.usage_label.text() != "Saved context: …")
    b.verify_all()
    wait_until(lambda: b.verify_result.text().startswith("Checked"))
    b.query.setText("river")
    b.table.selectRow(b.ids_shown().index(chats[1]))
    wait_until(lambda: not b.preview.loading)
    settle()
    b.grab().save(str(HERE / "browser.png"))

    export = Path(tempfile.mkdtemp(prefix="hearth-shots-")) / "rivers.json"
    b.table.selectAll()
    b.export_selected(str(export), "json")
    b.import_file(str(export))
    wait_until(lambda: b.duplicates_box is not None and b.duplicates_box.isVisible())
    box = b.duplicates_box
    wait_until(lambda: box.isVisible() and box.width() > 0)
    for _ in range(20):
        app.processEvents()
    # The question over the browser, as the person sees it: the screen's pixels (needs a real X server).
    screen = app.primaryScreen()
    frame = b.frameGeometry()
    screen.grabWindow(0, frame.x(), frame.y(), frame.width(), frame.height()).save(str(HERE / "import-duplicates.png"))
    box.done(0)
    w.close()
    print("wrote browser.png, import-duplicates.png")


if __name__ == "__main__":
    main()
