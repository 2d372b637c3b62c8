"""Take the screenshots of a chat longer than the model's context, with the real default model (offscreen):

    QT_QPA_PLATFORM=offscreen python docs/screenshots/take_context.py [--data-dir .test-cache/home]

The engine reads a 320-token context here so a few questions fill it. Writes context-limit.png (under
"stop": the error block with its buttons), context-limit-message.png (a pasted message too long by
itself: the block offers to edit it) and dropped-marker.png (under "drop_oldest": the marker
above the first message the model still reads) next to this file.
"""

from __future__ import annotations

import time

from shots import HERE, data_dir_arg, shot_config, wait_until

CONTEXT = 320
SYSTEM = "You are a friendly travel guide. Answer in one or two short sentences."
QUESTIONS = ["What is the capital of France?", "What should I see there first?", "And in Rome?",
             "What is a good day trip from Rome?", "What food should I try in Naples?", "And in Bologna?",
             "Which city has the best museums?", "What is the best season to visit Italy?"]


def main() -> None:
    models_home = data_dir_arg()
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from engine.api import Hearth

    _app = QApplication.instance() or QApplication([])  # kept alive for the whole run
    config = shot_config(models_home)

    def ask_until(w: MainWindow, done) -> None:
        for question in QUESTIONS:
            w.composer.setPlainText(question)
            w.composer.submit()
            wait_until(lambda: not w.turns.running(w.current))
            if done():
                return
        raise RuntimeError("the chat never reached the context's end")

    w = MainWindow(config, start_engine=False)
    # The window's engine reads the model's whole context (8,192 tokens); a small one fills in a few turns.
    w.worker._hearth = Hearth(config.paths, weights="int4", provider="cpu", context_length=CONTEXT)
    w.host.request_load.emit()
    w.resize(1100, 720)
    w.show()
    wait_until(lambda: w.model_info is not None)

    stop_chat = w.new_chat()
    w.store.set_system_prompt(stop_chat, SYSTEM)
    w.store.set_settings(stop_chat, {"temperature": 0.6, "seed": 11, "max_new_tokens": 60})
    ask_until(w, w.transcript.context_limit.isVisible)
    wait_until(lambda: not w.transcript.loading)
    settle = time.monotonic() + 0.8  # layouts and the scroll to the block finish over several event-loop turns
    wait_until(lambda: time.monotonic() > settle)
    w.grab().save(str(HERE / "context-limit.png"))

    # An over-long message in a new chat: the error block says so, the message waits in the box to edit.
    long_chat = w.new_chat()
    w.composer.clear()
    w.store.set_settings(long_chat, {"temperature": 0.6, "seed": 11, "max_new_tokens": 60})
    pasted = " ".join(f"Day {i}: we walked along the river, saw the old bridge and ate in the square."
                      for i in range(1, 40))
    w.composer.setPlainText("Please summarise my travel diary:\n" + pasted)
    w.composer.submit()
    wait_until(w.transcript.context_limit.isVisible)
    settle = time.monotonic() + 0.8
    wait_until(lambda: time.monotonic() > settle)
    w.grab().save(str(HERE / "context-limit-message.png"))

    drop_chat = w.new_chat()
    w.composer.clear()
    w.store.set_system_prompt(drop_chat, SYSTEM)
    w.store.set_settings(drop_chat, {"temperature": 0.6, "seed": 11, "max_new_tokens": 60, "context_policy": "drop_oldest"})
    ask_until(w, lambda: not w.transcript.view_marker.isHidden())
    wait_until(lambda: not w.transcript.loading)
    w.transcript.ensureWidgetVisible(w.transcript.view_marker, 0, 120)
    time.sleep(0.2)
    wait_until(lambda: True)
    w.grab().save(str(HERE / "dropped-marker.png"))
    w.close()
    print("wrote context-limit.png, context-limit-message.png and dropped-marker.png")


if __name__ == "__main__":
    main()
