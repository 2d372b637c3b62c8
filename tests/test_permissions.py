"""Hearth's files are private whatever the umask: every directory it makes 0700, every file 0600."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from engine.private_files import private_dir, private_file

from .conftest import REPO


def _cli(umask: int, home: Path, *args: str) -> subprocess.CompletedProcess:
    """hearth-cli in a process started under ``umask`` (a user's shell setting, not Hearth's)."""
    command = f"umask {umask:03o} && exec {sys.executable} -m engine.cli " + " ".join(f"'{a}'" for a in args)
    return subprocess.run(["sh", "-c", command], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HEARTH_HOME": str(home)})


def _modes(root: Path) -> dict[str, int]:
    """Permission bits of everything below ``root`` (symlinks themselves skipped, not followed)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if not path.is_symlink():
                found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_a_chat_leaves_only_private_files_whatever_the_umask(tmp_path, tiny_gguf, umask):
    home = tmp_path / "home"
    chat = _cli(umask, home, "chat", "--conversation", "c1", "--message", "hello there", "--greedy",
                "--max-new-tokens", "8", "--json", "--provider", "cpu", "--model", str(tiny_gguf))
    assert chat.returncode == 0, chat.stderr
    assert json.loads(chat.stdout)["save"] is not None  # a checkpoint was written
    export = _cli(umask, home, "bundle", "export", "c1", "--out", str(tmp_path / "c1.hearth"))
    assert export.returncode == 0, export.stderr  # makes the installation key too
    modes = _modes(home)
    assert {"conversations.sqlite3", "install.key", "checkpoints", "converted", "models"} <= set(modes)
    assert any(name.endswith(".hkc") for name in modes) and any(name.endswith(".hkb") for name in modes)
    assert any(name.endswith("index.sqlite3") for name in modes)
    assert any(name.endswith("model.onnx.data") for name in modes)
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    wrong = {name: oct(mode) for name, mode in modes.items()
             if mode != (0o700 if (home / name).is_dir() else 0o600)}
    assert not wrong, wrong


def test_the_helpers_fix_modes_that_exist_and_leave_foreign_parents_alone(tmp_path):
    outer = tmp_path / "outer"
    outer.mkdir(mode=0o755)
    os.chmod(outer, 0o755)
    made = private_dir(outer / "a" / "b")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700 and stat.S_IMODE((outer / "a").stat().st_mode) == 0o700
    assert stat.S_IMODE(outer.stat().st_mode) == 0o755  # it existed: not Hearth's to change
    loose = made / "f"
    loose.write_text("x")
    os.chmod(loose, 0o644)
    private_file(loose)
    assert stat.S_IMODE(loose.stat().st_mode) == 0o600 and loose.read_text() == "x"  # contents untouched
    os.chmod(made, 0o755)
    private_dir(made)
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
