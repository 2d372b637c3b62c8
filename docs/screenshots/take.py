"""Take the README's screenshots with the real default model (offscreen):

    QT_QPA_PLATFORM=offscreen python docs/screenshots/take.py [--data-dir .test-cache/home]

Writes main-window.png (a chat with code) and cache-banner.png (a damaged checkpoint being rebuilt)
next to this file. The dialogs, which need no model, are take_dialogs.py's.
"""

from __future__ import annotations

import time

from shots import HERE, data_dir_arg, shot_config, wait_until


def main() -> None:
    models_home = data_dir_arg()
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from engine.checkpoint.store import conversation_key

    _app = QApplication.instance() or QApplication([])  # kept alive for the whole run
    config = shot_config(models_home)

    def chat(w: MainWindow, text: str) -> None:
        w.composer.setPlainText(text)
        w.composer.submit()
        wait_until(lambda: not w.turns.running(w.current))

    w = MainWindow(config)
    w.resize(1100, 720)
    w.show()
    wait_until(lambda: w.model_info is not None)
    for text in ("What is the capital of France?", "Give me three tips for sleeping better."):
        w.new_chat()
        w.store.set_settings(w.current, {"temperature": 0.0, "max_new_tokens": 200})
        chat(w, text)
    code_chat = w.new_chat()
    w.store.set_settings(code_chat, {"temperature": 0.0, "max_new_tokens": 300})
    chat(w, "Write a Python function that checks whether a word is a palindrome, and explain it briefly.")
    time.sleep(0.2)
    wait_until(lambda: w.sidebar.badge(w.current) == "live")
    w.grab().save(str(HERE / "main-window.png"))

    # A long chat whose saved context gets damaged, reopened: the banner while it rebuilds.
    long_chat = w.new_chat()
    w.store.set_settings(long_chat, {"temperature": 0.0, "max_new_tokens": 40})
    chat(w, "Here are my notes; summarize them in one sentence.\n\n" + " ".join(
        f"Note {i}: the river rose after the storm and the lanterns by the harbour went out." for i in range(180)))
    w.close()
    path = next(config.paths.checkpoints.glob(f"{conversation_key(long_chat)}-*.hkv"))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x20
    path.write_bytes(bytes(data))
    w = MainWindow(config)
    w.resize(1100, 720)
    w.show()
    wait_until(lambda: w.banner.isVisible() and w.banner.progress.isVisible() and w.banner.progress.value() > 0)
    w.grab().save(str(HERE / "cache-banner.png"))
    wait_until(lambda: "Rebuilt" in w.banner.message.text())
    w.grab().save(str(HERE / "cache-banner-done.png"))
    w.close()
    print("wrote", *sorted(p.name for p in HERE.glob("*.png")))


if __name__ == "__main__":
    main()
