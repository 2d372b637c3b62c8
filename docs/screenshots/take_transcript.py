"""Take the transcript's screenshots with the real default model loaded (under Xvfb, or offscreen):

    xvfb-run -a -s "-screen 0 1400x900x24" env QT_QPA_PLATFORM=xcb python docs/screenshots/take_transcript.py

Writes code-blocks.png (a reply with highlighted code blocks, their language labels and Copy links, and
a bare URL as a link), code-blocks-dark.png (the same on a dark palette) and edit-mode.png (editing the
first message: the message highlighted, the hint above the message box). The chat's text is written
here, so the shots show typical code whatever the small model would have answered.
"""

from __future__ import annotations

import time

from shots import HERE, data_dir_arg, shot_config, wait_until

QUESTION = "How do I read a CSV file and sum one column in Python? And count its lines in the shell?"
REPLY = """With the standard library's `csv` module:

```python
import csv
from pathlib import Path


def column_total(path: Path, column: str) -> float:
    \"\"\"Sum one column of a CSV file with a header row.\"\"\"
    with path.open(newline="", encoding="utf-8") as f:
        return sum(float(row[column]) for row in csv.DictReader(f))


print(column_total(Path("sales.csv"), "amount"))  # e.g. 1234.5
```

In the shell, `wc` counts the lines (the header too):

```bash
wc -l sales.csv
tail -n +2 sales.csv | cut -d, -f3 | paste -sd+ | bc
```

The `csv` module's documentation: https://docs.python.org/3/library/csv.html."""


def dark_palette():
    from PySide6.QtGui import QColor, QPalette

    p = QPalette()
    roles = {QPalette.ColorRole.Window: "#202124", QPalette.ColorRole.WindowText: "#e8eaed",
             QPalette.ColorRole.Base: "#1b1c1e", QPalette.ColorRole.AlternateBase: "#26272a",
             QPalette.ColorRole.Text: "#e8eaed", QPalette.ColorRole.Button: "#2d2e31",
             QPalette.ColorRole.ButtonText: "#e8eaed", QPalette.ColorRole.Highlight: "#3d6fd6",
             QPalette.ColorRole.HighlightedText: "#ffffff", QPalette.ColorRole.Link: "#8ab4f8",
             QPalette.ColorRole.ToolTipBase: "#2d2e31", QPalette.ColorRole.ToolTipText: "#e8eaed",
             QPalette.ColorRole.PlaceholderText: "#9aa0a6"}
    for role, colour in roles.items():
        p.setColor(role, QColor(colour))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor("#80868b"))
    return p


def settle(seconds: float = 0.8) -> None:
    """Turn the event loop for a while: layouts and scrolling finish over several turns."""
    end = time.monotonic() + seconds
    wait_until(lambda: time.monotonic() > end)


def main() -> None:
    models_home = data_dir_arg()
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow

    app = QApplication.instance() or QApplication([])
    app.setStyle("Fusion")  # one look on every machine, and a palette it follows fully
    config = shot_config(models_home)
    w = MainWindow(config)
    w.resize(1100, 760)
    w.show()
    wait_until(lambda: w.model_info is not None)

    conv = w.new_chat()
    w.store.rename(conv, "Sum a CSV column")
    w.store.append(conv, "user", QUESTION)
    w.store.append(conv, "assistant", REPLY)
    w.sidebar.upsert(conv, "Sum a CSV column", w.store.require(conv).updated_ms)
    w.chat.show_chat(conv)
    wait_until(lambda: not w.transcript.loading)
    settle()
    w.grab().save(str(HERE / "code-blocks.png"))

    app.setPalette(dark_palette())
    w.chat.show_chat(conv)  # re-rendered: code colours are taken from the palette when a message is drawn
    wait_until(lambda: not w.transcript.loading)
    settle()
    w.grab().save(str(HERE / "code-blocks-dark.png"))

    app.setPalette(app.style().standardPalette())
    w.chat.show_chat(conv)
    wait_until(lambda: not w.transcript.loading)
    w.chat.begin_edit(w.transcript.messages[0].seq)
    w.transcript.verticalScrollBar().setValue(0)
    settle()
    w.grab().save(str(HERE / "edit-mode.png"))
    w.chat.cancel_edit()
    w.close()
    print("wrote code-blocks.png, code-blocks-dark.png and edit-mode.png")


if __name__ == "__main__":
    main()
