"""Take the shell's screenshots with the real default model, under a real X server:

    xvfb-run -a -s "-screen 0 1400x900x24" env QT_QPA_PLATFORM=xcb \
        python docs/screenshots/take_shell.py [--data-dir .test-cache/home]

Writes main-window.png (light), main-window-dark.png, sidebar-groups.png (a pinned chat, date groups
and the filter box), shortcuts.png (Help → Keyboard shortcuts), data-locations.png, rename.png and
about.png next to this file.
"""

from __future__ import annotations

import datetime as dt
import time

from shots import HERE, data_dir_arg, shot_config, wait_until


def days_ago(n: int, hour: int = 12) -> int:
    day = dt.date.today() - dt.timedelta(days=n)
    return int(dt.datetime.combine(day, dt.time(hour)).timestamp() * 1000)


def older_chats() -> list[dict]:
    """Chats from earlier days, so every date group shows."""
    rows = [("Yesterday", "Packing list for a weekend hike", 1), ("Week", "Explain Python decorators simply", 3),
            ("Week", "Bread recipe without a mixer", 6), ("Older", "Cover letter for a library job", 20),
            ("Older", "What is a KV cache?", 45)]
    return [{"id": f"shot-{i}", "title": title, "system_prompt": "", "settings": {}, "model": "",
             "created_ms": days_ago(n), "updated_ms": days_ago(n),
             "messages": [{"role": "user", "content": title, "created_ms": days_ago(n)}]}
            for i, (_group, title, n) in enumerate(rows)]


def main() -> None:
    models_home = data_dir_arg()
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from app.theme import ThemeMode

    app = QApplication.instance() or QApplication([])
    config = shot_config(models_home)

    def chat(w: MainWindow, text: str, tokens: int) -> None:
        w.new_chat()
        w.store.set_settings(w.current, {"temperature": 0.0, "max_new_tokens": tokens})
        w.composer.setPlainText(text)
        w.composer.submit()
        wait_until(lambda: not w.turns.running(w.current))

    def settle(seconds: float = 0.4) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents()

    w = MainWindow(config)
    w.resize(1100, 720)
    w.show()
    wait_until(lambda: w.model_info is not None)
    w.store.insert_full(older_chats())
    w.reload_list()
    chat(w, "What is the capital of France?", 60)
    w.set_pinned(w.current, True)
    chat(w, "Give me three tips for sleeping better.", 120)
    chat(w, "Write a Python function that checks whether a word is a palindrome, and explain it briefly.", 300)
    wait_until(lambda: w.sidebar.badge(w.current) == "live")

    w.set_theme(ThemeMode.LIGHT)
    settle()
    w.grab().save(str(HERE / "main-window.png"))
    w.set_theme(ThemeMode.DARK)
    settle()
    w.grab().save(str(HERE / "main-window-dark.png"))
    w.set_theme(ThemeMode.LIGHT)
    settle()

    left = w.sidebar.parentWidget()
    w.filter_box.setFocus()
    settle()
    left.grab().save(str(HERE / "sidebar-groups.png"))

    dialog = w.show_shortcuts()
    settle()
    dialog.grab().save(str(HERE / "shortcuts.png"))
    dialog.close()
    for name, opened in (("data-locations.png", w.show_data_locations()), ("rename.png", w.rename_current()),
                         ("about.png", w.show_about())):
        settle()
        opened.grab().save(str(HERE / name))
        opened.close()
    w.set_theme(ThemeMode.SYSTEM)
    w.close()
    print("wrote main-window.png main-window-dark.png sidebar-groups.png shortcuts.png data-locations.png rename.png "
          "about.png")


if __name__ == "__main__":
    main()
