"""``hearth --startup-probe``: when did the window become interactive, and when was the model ready?

It prints one JSON line to stdout and quits once the model is ready (exit 0) or failed to load (exit 1):

    {"probe": "startup", "process_start_unix": …, "window_interactive_unix": …, "model_ready_unix": …,
     "window_interactive_ms": …, "model_ready_ms": …, "provider": "cpu" | "cuda", "error": null}

"Interactive" is the first turn of the event loop after ``show()``: the window has been shown, its
pending events handled, and it answers input from then on (the model loads on the engine thread
behind it). The ``*_ms`` figures count from the process's start as the kernel recorded it
(``/proc/self/stat``, 10 ms resolution); a benchmark that launches the process should also take its
own clock before launching (``bench/package.py`` does).
"""

from __future__ import annotations

import json
import os
import sys
import time

from PySide6.QtCore import QObject, QTimer, Slot
from PySide6.QtWidgets import QApplication, QMainWindow

from engine.types import ModelInfo

MODEL_TIMEOUT_MS = 180_000


def process_start_unix() -> float | None:
    """When the kernel started this process (Linux), as a Unix time; None elsewhere."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime, counted after the ")" that ends the command name
        with open("/proc/stat", encoding="ascii") as fh:
            boot = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


class StartupProbe(QObject):
    def __init__(self, app: QApplication, window: QMainWindow):
        super().__init__(window)
        self.app, self.window = app, window
        self.interactive: float | None = None
        self.failure: str | None = None
        self.done = False
        self.provider: str | None = None  # where the model runs ("cpu", "cuda"), once it is ready
        window.worker.ready.connect(self.on_ready)
        window.worker.setup_failed.connect(self.on_failed)
        window.worker.needs_model.connect(self.on_needs_model)
        QTimer.singleShot(0, self.on_interactive)  # runs once the events queued by show() are handled
        QTimer.singleShot(MODEL_TIMEOUT_MS, lambda: self.on_failed("timed out waiting for the model"))

    @Slot()
    def on_interactive(self) -> None:
        self.interactive = time.time()

    @Slot(object)
    def on_ready(self, info: ModelInfo) -> None:
        self.provider = info.provider
        self.finish(time.time())

    @Slot(str)
    def on_failed(self, message: str) -> None:
        self.failure = message
        self.finish(None)

    @Slot()
    def on_needs_model(self) -> None:
        self.on_failed("the default model is not installed")

    def finish(self, ready: float | None) -> None:
        if self.done:
            return
        self.done = True
        start = process_start_unix()

        def since(t: float | None) -> float | None:
            return None if t is None or start is None else round((t - start) * 1000, 1)

        print(json.dumps({"probe": "startup", "process_start_unix": start, "window_interactive_unix": self.interactive,
                          "model_ready_unix": ready, "window_interactive_ms": since(self.interactive),
                          "model_ready_ms": since(ready), "provider": self.provider,
                          "error": self.failure}), flush=True)
        if self.failure:
            print(f"hearth: startup probe: {self.failure}", file=sys.stderr)
        self.window.close()  # stops the engine thread
        self.app.exit(1 if self.failure else 0)
