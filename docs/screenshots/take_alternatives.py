"""Take the screenshots of a regenerated reply's versions and of the live figures, with the real default model:

    xvfb-run -a -s "-screen 0 1400x900x24" env QT_QPA_PLATFORM=xcb python docs/screenshots/take_alternatives.py

Writes alternatives.png (a reply written three times, showing ‹ 2/3 ›: the version the chat goes on
with) and live-figures.png (a reply being written: time to the first token, tokens per second and the
context meter in the status bar, updated as tokens arrive) next to this file.
"""

from __future__ import annotations

import time

from shots import HERE, data_dir_arg, shot_config, wait_until

QUESTION = "Suggest a name for a small grey cat, with one sentence on why."


def settle() -> None:
    time.sleep(0.2)
    wait_until(lambda: True)


def main() -> None:
    models_home = data_dir_arg()
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow

    _app = QApplication.instance() or QApplication([])  # kept alive for the whole run
    w = MainWindow(shot_config(models_home))
    w.resize(1100, 720)
    w.show()
    wait_until(lambda: w.model_info is not None)

    conv = w.new_chat()
    w.store.set_settings(conv, {"temperature": 0.9, "max_new_tokens": 80})
    w.composer.setPlainText(QUESTION)
    w.composer.submit()
    wait_until(lambda: not w.turns.running(conv))
    for _ in range(2):
        w.regenerate()
        wait_until(lambda: not w.turns.running(conv))
    w.act_earlier_version.trigger()  # back to 2/3: the chat continues with it
    wait_until(lambda: not w.transcript.loading)
    settle()
    w.grab().save(str(HERE / "alternatives.png"))

    w.store.set_settings(conv, {"temperature": 0.9, "max_new_tokens": 300})
    w.composer.setPlainText("Now write a short poem about that cat.")
    w.composer.submit()
    wait_until(lambda: len(w.turns.turn(conv).reply if w.turns.turn(conv) else "") > 120
               or not w.turns.running(conv))
    settle()
    w.grab().save(str(HERE / "live-figures.png"))
    wait_until(lambda: not w.turns.running(conv))
    w.close()
    print("wrote alternatives.png and live-figures.png")


if __name__ == "__main__":
    main()
