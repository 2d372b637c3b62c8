"""Screenshots of the first run and of the rebuild banner (issue 18), under a real X server:

    xvfb-run -a -s "-screen 0 1400x900x24" env QT_QPA_PLATFORM=xcb \
        python docs/screenshots/take_firstrun.py [--data-dir .test-cache/home]

Writes first-run-offline.png (the package index cannot be reached), first-run-converting.png (the
second step, fed by a real conversion of the default model), cache-banner.png (a chat whose checkpoint
was cut to a third, rebuilding) and cache-banner-done.png (rebuilt and saved) next to this file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from shots import HERE, data_dir_arg, shot_config, wait_until


def settle() -> None:
    """Let Qt run the layout passes a change just posted, so the picture shows the laid-out result."""
    import time

    until = time.monotonic() + 0.3
    wait_until(lambda: time.monotonic() > until)


def first_run_offline() -> None:
    from app.config import AppConfig
    from app.main_window import MainWindow
    from engine.api import resolve_paths

    os.environ["HEARTH_PYPI_URL"] = "http://127.0.0.1:9/simple"  # nothing listens there: offline
    home = Path(tempfile.mkdtemp(prefix="hearth-shots-fresh-"))
    w = MainWindow(AppConfig(resolve_paths(home).ensure(), model=None, provider="cpu"))
    wait_until(lambda: w.setup.dialog is not None and w.setup.dialog.failure.isVisible())
    dialog = w.setup.dialog
    wait_until(lambda: dialog.error.height() >= dialog.error.heightForWidth(dialog.error.width()))
    settle()
    dialog.grab().save(str(HERE / "first-run-offline.png"))
    w.host.stop()
    w.close()


def first_run_converting(models_home: str) -> None:
    """The dialog as a real conversion of the default model reports its steps, caught mid-way."""
    from app.model_setup import ModelSetupDialog
    from engine.api import Hearth, resolve_paths
    from engine.model.fetch import default_model
    from engine.types import SetupProgress, SetupStage

    dialog = ModelSetupDialog()
    dialog.show()
    size = (Path(models_home) / "models" / default_model().filename).stat().st_size
    dialog.on_progress(SetupProgress(SetupStage.DOWNLOAD, size, size))
    home = Path(tempfile.mkdtemp(prefix="hearth-shots-convert-"))
    (home / "models").symlink_to(Path(models_home).resolve() / "models")
    taken = []

    def report(progress: SetupProgress) -> None:
        dialog.on_progress(progress)
        if not taken and progress.step == "layer 19 of 30":
            settle()
            dialog.grab().save(str(HERE / "first-run-converting.png"))
            taken.append(progress)

    service = Hearth(resolve_paths(home).ensure(), provider="cpu")
    service.load(report)
    service.close()
    dialog.close()


def rebuild_banner(models_home: str) -> None:
    """A chat whose checkpoint was cut to a third (defect 4's reproduction), opened: rebuilding, then done."""
    from app.main_window import MainWindow
    from engine.checkpoint.store import conversation_key

    config = shot_config(models_home)
    w = MainWindow(config)
    w.resize(1100, 720)
    w.show()
    wait_until(lambda: w.model_info is not None)
    chat = w.new_chat()
    w.store.set_system_prompt(chat, "You are a careful assistant. Answer in one or two sentences.")
    w.store.set_settings(chat, {"temperature": 0.0, "max_new_tokens": 40})
    w.composer.setPlainText("Here are my notes; summarize them in one sentence.\n\n" + " ".join(
        f"Note {i}: the river rose after the storm and the lanterns by the harbour went out." for i in range(180)))
    w.composer.submit()
    wait_until(lambda: not w.turns.running(w.current))
    w.close()
    path = next(config.paths.checkpoints.glob(f"{conversation_key(chat)}-*.hkv"))
    os.truncate(path, path.stat().st_size // 3)
    w = MainWindow(config)
    w.resize(1100, 720)
    w.show()
    wait_until(lambda: w.banner.isVisible() and w.banner.progress.isVisible()
               and w.banner.progress.value() > w.banner.progress.maximum() // 3)
    w.grab().save(str(HERE / "cache-banner.png"))
    wait_until(lambda: "Rebuilt" in w.banner.message.text())
    settle()
    w.grab().save(str(HERE / "cache-banner-done.png"))
    w.close()


def main() -> None:
    models_home = data_dir_arg()
    from PySide6.QtWidgets import QApplication

    _app = QApplication.instance() or QApplication([])  # kept alive for the whole run
    first_run_offline()
    first_run_converting(models_home)
    rebuild_banner(models_home)
    print("wrote first-run-offline.png first-run-converting.png cache-banner.png cache-banner-done.png")


if __name__ == "__main__":
    main()
