"""The code base stays ruff-clean, and the engine never imports Qt."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_ruff_clean():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--output-format", "concise", str(REPO)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_engine_never_imports_qt():
    offenders = [str(p) for p in (REPO / "engine").rglob("*.py") if "PySide6" in p.read_text() or "QtCore" in p.read_text()]
    assert offenders == []
