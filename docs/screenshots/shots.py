"""What the screenshot scripts share: a throw-away data dir that links to the real models, and a wait
that keeps Qt's event loop turning (offscreen)."""

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


def data_dir_arg() -> str:
    """``--data-dir``: where the models and their conversions are (default: the test cache's home)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=str(ROOT / ".test-cache" / "home"))
    return ap.parse_args().data_dir


def shot_config(models_home: str):
    """An AppConfig on a fresh data dir whose models/ and converted/ are ``models_home``'s."""
    from app.config import AppConfig
    from engine.api import resolve_paths

    home = Path(tempfile.mkdtemp(prefix="hearth-shots-"))
    for sub in ("models", "converted"):
        (home / sub).symlink_to(Path(models_home).resolve() / sub)
    return AppConfig(resolve_paths(home).ensure(), weights="int4", provider="cpu")


def wait_until(cond, timeout_s: float = 300) -> None:
    from PySide6.QtCore import QEventLoop, QTimer

    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError
        loop = QEventLoop()
        QTimer.singleShot(10, loop.quit)
        loop.exec()


def settle(ms: int = 300) -> None:
    """Let the event loop run for ``ms``: deferred layout passes and repaints finish before a grab."""
    deadline = time.monotonic() + ms / 1000
    wait_until(lambda: time.monotonic() >= deadline)
