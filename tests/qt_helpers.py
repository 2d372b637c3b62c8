"""Helpers for the window tests: signal recorders that run on the UI thread, sending, waiting.
(The ``config`` and ``windows`` fixtures live in conftest.py.)"""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt, Slot

from app.main_window import MainWindow

TIMEOUT = 60_000


class Recorder(QObject):
    """Receives a worker signal on the UI thread, after the window's own handlers (connected first)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    @Slot(str, object)
    def record(self, *args) -> None:
        self.fn(*args)


_recorders: list[QObject] = []


def on_ui_thread(signal, fn) -> None:
    recorder = Recorder(fn)
    _recorders.append(recorder)  # kept alive for the session
    signal.connect(recorder.record)


def collect(signal) -> list:
    """Record a worker signal's (conversation, payload) arguments as the UI thread sees them (the payload is
    the engine API's typed object: Resume, Finished, ...)."""
    seen: list = []
    on_ui_thread(signal, lambda *args: seen.append(args))
    return seen


class EventRecorder(QObject):
    """Receives the worker's conversation events of one type on the UI thread, after the window's handlers."""

    def __init__(self, kind: type, fn):
        super().__init__()
        self.kind, self.fn = kind, fn

    @Slot(object)
    def record(self, event: object) -> None:
        if isinstance(event, self.kind):
            self.fn(event)


def on_event(worker, kind: type, fn) -> None:
    """Call ``fn(event)`` on the UI thread for each of the worker's events of type ``kind``."""
    recorder = EventRecorder(kind, fn)
    _recorders.append(recorder)
    worker.conversation_event.connect(recorder.record)


def collect_events(worker, kind: type) -> list:
    """The worker's events of type ``kind`` (``Resumed``, ``Finished``, ``Rebuilding``...) as the UI thread sees them."""
    seen: list = []
    on_event(worker, kind, seen.append)
    return seen


def collect_pairs(worker, kind: type, field: str | None = None) -> list:
    """(conversation, the event or its ``field``) of the worker's events of type ``kind``, on the UI thread."""
    seen: list = []
    on_event(worker, kind, lambda e: seen.append((e.conversation, getattr(e, field) if field else e)))
    return seen


def collect_dispatched(turns, kind: type) -> list:
    """(conversation, event) of the events of type ``kind`` the window's dispatcher hands its handlers
    (``TurnControl.events``), in the order they reached them."""
    seen: list = []
    turns.events.on(kind, lambda e: seen.append((e.conversation, e)))
    return seen


def use_settings(w: MainWindow, settings: dict) -> None:
    w.store.set_settings(w.current, settings)


def send(qtbot, w: MainWindow, text: str) -> None:
    qtbot.keyClicks(w.composer, text)
    qtbot.keyClick(w.composer, Qt.Key.Key_Return)


def wait_idle(qtbot, w: MainWindow) -> None:
    """Until no turn is in flight in any chat and the transcript has drawn every message (a reload draws
    the newest first and the rest over later event-loop turns, which lag on a busy machine)."""
    qtbot.waitUntil(lambda: not w.turns.running() and not w.transcript.loading, timeout=TIMEOUT)


def new_chat_with_turn(qtbot, w: MainWindow, text: str, settings: dict | None = None) -> str:
    """Start a chat in ``w``, send ``text`` and wait for the reply; return the chat's id."""
    conv = w.new_chat()
    use_settings(w, settings or {"temperature": 0.0, "max_new_tokens": 8})
    send(qtbot, w, text)
    wait_idle(qtbot, w)
    return conv


def flip_byte(path, where: float, mask: int) -> None:
    """Damage a file in place: XOR one byte at fraction ``where`` of its length."""
    data = bytearray(path.read_bytes())
    data[int(len(data) * where)] ^= mask
    path.write_bytes(bytes(data))
