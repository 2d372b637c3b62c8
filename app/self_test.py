"""``hearth --self-test``: prove an installed Hearth works, end to end, without touching user data.

It opens the real window (offscreen works: ``QT_QPA_PLATFORM=offscreen``), waits for the model,
sends one message through the composer and waits for the reply, closes the window (which saves the
live context), then loads the model again outside the window and checks the saved context the way a
later launch would: a full verification of the file (every checksum, the model and tokenizer
fingerprints), a restore through the engine API (``saved_contexts(hearth).check_restore``), and the
restored context's next-token logits against a cold prefill of the same prompt. It prints one line per
step and exits 0, or 1 with the step that failed and why.

Everything happens in a throwaway data dir (removed afterwards) unless ``--data-dir`` is given; the
model is then read from where it is installed (the bundled one, or what ``hearth-cli model fetch``
fetched). The self-test never downloads anything: with no model it fails and says so.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from app.text import duration
from engine.errors import HearthError
from engine.types import Finished

log = logging.getLogger(__name__)

PROMPT = "What is the capital of France?"
SETTINGS = {"temperature": 0.0, "max_new_tokens": 16}
STEP_TIMEOUT_S = 180.0
MODULE_MANIFEST = "hearth-modules.txt"  # written by packaging/hearth.spec


class SelfTestFailed(Exception):
    """A step failed; the message says what was expected and what happened."""

    def __init__(self, step: str, message: str):
        super().__init__(message)
        self.step = step


@dataclass
class SelfTestReport:
    data_dir: Path
    throwaway: bool
    lines: list[tuple[str, str]] = field(default_factory=list)  # (step, what was seen)

    def ok(self, step: str, detail: str) -> None:
        self.lines.append((step, detail))
        log.info("self-test %s: %s", step, detail)

    def render(self) -> str:
        kind = "throwaway, removed afterwards" if self.throwaway else "kept"
        out = ["Hearth self-test", f"  data dir   {self.data_dir} ({kind})"]
        out += [f"  ok  {step:<10} {detail}" for step, detail in self.lines]
        return "\n".join(out)


def run_self_test(data_dir: str | None = None, *, model: str | None = None, weights: str = "int4",
                  provider: str = "auto") -> int:
    """Run every step; print the report. 0 when all passed, 1 (with the failing step on stderr) otherwise."""
    throwaway = data_dir is None
    root = Path(tempfile.mkdtemp(prefix="hearth-self-test-")) if throwaway else Path(data_dir).expanduser()
    report = SelfTestReport(root.resolve(), throwaway)
    try:
        run_steps(report, model=model, weights=weights, provider=provider)
    except SelfTestFailed as exc:
        print(report.render())
        print(f"hearth: self-test FAILED at {exc.step}: {exc}", file=sys.stderr)
        return 1
    finally:
        if throwaway:
            shutil.rmtree(root, ignore_errors=True)
    print(report.render())
    print("self-test passed")
    return 0


def own_modules() -> list[str]:
    """Hearth's own modules: in a packaged build the list the build wrote (``hearth-modules.txt``), from a
    source tree every ``.py`` under ``engine/`` and ``app/``."""
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle is not None:
        manifest = Path(bundle) / MODULE_MANIFEST
        try:
            return [line for line in manifest.read_text(encoding="utf-8").splitlines() if line]
        except OSError as exc:
            raise SelfTestFailed("modules", f"the build's module list is missing: {exc}") from None
    root = Path(__file__).resolve().parent.parent
    return sorted(".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
                  for package in ("engine", "app") for f in (root / package).rglob("*.py"))


def check_modules(report: SelfTestReport) -> None:
    """Import every module of Hearth's: a dependency a packaged build left out fails here, naming it."""
    names = own_modules()
    broken = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure to import is the finding
            broken.append(f"{name} ({type(exc).__name__}: {exc})")
    if broken:
        raise SelfTestFailed("modules", f"{len(broken)} of {len(names)} modules cannot be imported: "
                                        + "; ".join(broken))
    report.ok("modules", f"all {len(names)} of Hearth's modules import")


def run_steps(report: SelfTestReport, *, model: str | None, weights: str, provider: str) -> None:
    from app.config import AppConfig
    from engine.api import Hearth, bundled_model_dir, resolve_paths

    check_modules(report)
    try:
        paths = resolve_paths(report.data_dir)
        if report.throwaway and bundled_model_dir() is None:
            # Conversations and saved context go to the throwaway dir; the model comes from where
            # ``hearth-cli model fetch`` put it (HEARTH_HOME or the platform's cache), else a source
            # install would find none. Reading it there touches no user data. A packaged build tests
            # the model it ships, even when the user has also fetched one (the throwaway models/ is empty).
            installed = resolve_paths(None)
            paths = dataclasses.replace(paths, models=installed.models, converted=installed.converted)
        paths = paths.ensure()
    except OSError as exc:
        raise SelfTestFailed("data dir", f"cannot use {report.data_dir}: {exc.strerror or exc}") from None
    try:
        source = Hearth(paths, model=model, weights=weights, provider=provider).locate_model()
    except HearthError as exc:
        raise SelfTestFailed("model", f"no model to test with ({exc}); a packaged build ships one, from source "
                                      "set HEARTH_BUNDLED_MODEL or pass --data-dir with the model fetched") from None
    report.ok("model", source.description)
    config = AppConfig(paths, model, weights, provider)
    conversation = window_turn(config, report)
    verify_and_restore(config, conversation, report)


# the window ------------------------------------------------------------------------------------------------
def _wait(condition: Callable[[], bool], timeout_s: float, step: str, what: str,
          failure: Callable[[], str | None] = lambda: None) -> None:
    """Run the event loop until ``condition`` holds; fail on timeout or when ``failure`` returns a message."""
    from PySide6.QtWidgets import QApplication

    deadline = time.monotonic() + timeout_s
    while not condition():
        problem = failure()
        if problem:
            raise SelfTestFailed(step, problem)
        if time.monotonic() > deadline:
            raise SelfTestFailed(step, f"timed out after {duration(timeout_s * 1000)} waiting for {what}")
        QApplication.processEvents()
        time.sleep(0.005)


def window_turn(config, report: SelfTestReport) -> str:
    """Open the window, wait for the model, send one message, wait for the reply, close (saving). Returns
    the conversation's id."""
    from PySide6.QtCore import QObject, Slot
    from PySide6.QtWidgets import QApplication

    from app.single_instance import SingleInstance

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Hearth")
    if SingleInstance(config.paths.data).already_running():
        raise SelfTestFailed("window", f"Hearth is already running on {config.paths.data}; close it or use another "
                                       "--data-dir")
    from app.conversation_events import OpenFailed, TurnFailed
    from app.main_window import MainWindow

    class Seen(QObject):  # lives on the UI thread: the worker's signals arrive queued
        def __init__(self) -> None:
            super().__init__()
            self.failure: str | None = None
            self.turns: list[Finished] = []

        @Slot(str)
        def setup_failed(self, message: str) -> None:
            self.failure = f"the model could not be loaded: {message}"

        @Slot()
        def needs_model(self) -> None:
            self.failure = "the window found no model"

        @Slot(object)
        def on_event(self, event: object) -> None:
            """The worker's conversation events: a finished turn is kept, a failed one or opening is the failure."""
            if isinstance(event, Finished):
                self.turns.append(event)
            elif isinstance(event, (OpenFailed, TurnFailed)):
                self.failure = f"the engine failed: {event.error}"

    seen = Seen()
    started = time.perf_counter()
    window = MainWindow(config)
    worker = window.worker
    worker.setup_failed.connect(seen.setup_failed)
    worker.needs_model.connect(seen.needs_model)
    worker.conversation_event.connect(seen.on_event)
    try:
        window.show()
        _wait(lambda: window.isVisible() and window.windowHandle() is not None and window.windowHandle().isExposed(),
              30, "window", "the window to be shown")
        shown_ms = (time.perf_counter() - started) * 1000
        _wait(lambda: window.model_info is not None, STEP_TIMEOUT_S, "window", "the model to load",
              lambda: seen.failure)
        info = window.model_info
        note = f"; {info.note}" if info.note else ""
        report.ok("window", f"shown in {duration(shown_ms)}; {info.name} {info.weights} on {info.provider} "
                            f"ready in {duration((time.perf_counter() - started) * 1000)}{note}; "
                            f"{kernels(info)}")

        conversation = window.new_chat()
        window.store.rename(conversation, "Self-test")
        window.store.set_settings(conversation, SETTINGS)
        window.composer.setPlainText(PROMPT)
        window.composer.submit()  # what Enter does
        turn_started = time.perf_counter()
        _wait(lambda: any(t.conversation == conversation for t in seen.turns), STEP_TIMEOUT_S, "chat turn",
              "the reply", lambda: seen.failure)
        turn = next(t for t in seen.turns if t.conversation == conversation)
        stored = window.store.messages(conversation)
        if [m.role for m in stored] != ["user", "assistant"] or stored[0].content != PROMPT or not stored[1].content.strip():
            raise SelfTestFailed("chat turn", f"expected the message and a non-empty reply stored, got "
                                              f"{[(m.role, m.content[:40]) for m in stored]}")
        reply = " ".join(stored[1].content.split())
        report.ok("chat turn", f"“{reply[:60]}{'…' if len(reply) > 60 else ''}” ({turn.stop_reason}, "
                               f"{duration((time.perf_counter() - turn_started) * 1000)}, {turn.timings.decode_tokens_per_s:.0f} "
                               "tokens/s)")
        save = turn.local.save if turn.local is not None else None
        if save is None or not save.ok:
            raise SelfTestFailed("save", f"the turn's context was not saved: {save.error if save else 'no save'}")
        report.ok("save", f"{save.tokens} tokens, {save.bytes_written:,} bytes in {duration(save.elapsed_ms)}")
    finally:
        window.close()  # saves the window state and what is live; stops the engine thread
    stopped = not window.host.thread.isRunning()
    window.deleteLater()
    if not stopped:
        raise SelfTestFailed("close", "the engine thread did not stop when the window closed")
    return conversation


def kernels(info) -> str:
    """Whose attention and head kernels run, as the local engine tells it."""
    if info.local is None:
        return "kernels not told by this backend"
    return f"attention kernel {info.local.attention}, head {info.local.head}, matmuls {info.local.matmul}"


# the saved context, as a later launch sees it -------------------------------------------------------------
def verify_and_restore(config, conversation: str, report: SelfTestReport) -> None:
    """Verify the conversation's saved context fully, restore it into a freshly loaded model, and check the
    restored context's next-token logits against a cold prefill of the same prompt."""
    from engine.api import Hearth, saved_contexts
    from engine.types import ContextHealth, ResumeSource

    hearth = Hearth(config.paths, model=config.model, weights=config.weights, provider=config.provider)
    try:
        try:
            info = hearth.load()
        except HearthError as exc:
            raise SelfTestFailed("verify", f"the model could not be loaded again: {exc}") from None
        status = saved_contexts(hearth).context_status(conversation, full=True)
        if status.health == ContextHealth.NONE:
            raise SelfTestFailed("verify", f"no saved context for {conversation} in {config.paths.checkpoints}")
        if status.health != ContextHealth.VALID:
            raise SelfTestFailed("verify", f"the saved context is {status.health}: {status.message}")
        report.ok("verify", f"{status.tokens} tokens ({status.bytes:,} bytes), every checksum and fingerprint valid")
        check = saved_contexts(hearth).check_restore(conversation)
    finally:
        hearth.close()
    resume = check.resume
    if resume.source != ResumeSource.DISK or resume.restored_tokens <= 0:
        raise SelfTestFailed("restore", f"expected the context from disk, got {resume.source} "
                                        f"({resume.reason or 'no reason'}: {resume.message})")
    if not check.matches:
        raise SelfTestFailed("restore", f"the restored context predicts differently from a cold prefill "
                                        f"(max logit difference {check.max_logit_diff:.3g}, allowed "
                                        f"{check.tolerance:.3g}; same next token: {check.same_next_token})")
    report.ok("restore", f"{resume.restored_tokens} tokens from disk in {duration(resume.restore_ms)} (model loaded "
                         f"in {duration(info.load_ms)}); next-token logits match a cold prefill (max diff "
                         f"{check.max_logit_diff:.1g}, allowed {check.tolerance:.1g})")
