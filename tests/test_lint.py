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


def test_server_reaches_the_engine_only_through_its_api():
    """engine/server may use engine.api, engine.types and engine.errors (and itself), nothing deeper."""
    import re

    allowed = ("engine.api", "engine.types", "engine.errors", "engine.server")
    offenders = []
    for path in (REPO / "engine" / "server").rglob("*.py"):
        for name in re.findall(r"^\s*(?:from|import)\s+(engine[\w.]*)", path.read_text(), re.MULTILINE):
            if not name.startswith(allowed):
                offenders.append(f"{path.name}: {name}")
    assert offenders == []
