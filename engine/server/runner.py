"""The one engine thread: every request's model work runs here, one at a time, in the order it came.

``EngineRunner`` is the interface the server needs. ``ThreadRunner`` implements it with a thread of its
own (``hearth-cli serve``); ``PostedRunner`` with a thread someone else owns (the window's engine
thread), so a window turn and an API request queue behind each other on one engine.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

log = logging.getLogger(__name__)


class QueueFullError(Exception):
    """More requests are waiting than the queue holds; the client should retry later (HTTP 429)."""


class RunnerClosedError(Exception):
    """The runner is shutting down and takes no new work (HTTP 503)."""


class EngineRunner(Protocol):
    def submit(self, fn: Callable[[], Any]) -> Future:
        """Queue ``fn`` to run on the engine thread; QueueFullError when the queue is full."""
        ...


_STOP = object()


class _BoundedRunner:
    """What both runners share: ``max_queue`` bounds the jobs waiting (the one running is not counted), so
    a flood of clients gets 429s instead of an unbounded backlog; a closed runner takes nothing new."""

    def __init__(self, max_queue: int):
        if max_queue < 1:
            raise ValueError("max_queue must be at least 1")
        self.max_queue = max_queue
        self._waiting = 0
        self._lock = threading.Lock()
        self._closed = False

    @property
    def waiting(self) -> int:
        return self._waiting

    def submit(self, fn: Callable[[], Any], *, bounded: bool = True) -> Future:
        """``bounded`` False: housekeeping (loading, unloading, closing) that must not be refused."""
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RunnerClosedError("the server is shutting down")
            if bounded and self._waiting >= self.max_queue:
                raise QueueFullError(f"{self._waiting} requests are already waiting for the model")
            self._waiting += 1
        self._enqueue(lambda: self._run(fn, future))
        return future

    def _enqueue(self, job: Callable[[], None]) -> None:
        raise NotImplementedError

    def _run(self, fn: Callable[[], Any], future: Future) -> None:
        """On the engine thread: one job, its result or error handed to the request that asked."""
        with self._lock:
            self._waiting = max(0, self._waiting - 1)
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as exc:  # the thread carries on
            future.set_exception(exc)


class ThreadRunner(_BoundedRunner):
    """A thread of its own that runs submitted callables in order."""

    def __init__(self, max_queue: int = 16, name: str = "hearth-engine"):
        super().__init__(max_queue)
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _enqueue(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def close(self, last: Callable[[], Any] | None = None, timeout: float | None = None) -> None:
        """Take no new work, run what is queued, then ``last`` (saving), and join the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if last is not None:
            self._jobs.put(lambda: self._run(last, Future()))
        self._jobs.put(_STOP)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not _STOP:
            job()


class PostedRunner(_BoundedRunner):
    """Over a thread someone else owns: ``post(job)`` hands ``job`` to that thread, which runs posted jobs
    in order among its own work."""

    def __init__(self, post: Callable[[Callable[[], None]], None], max_queue: int = 16):
        super().__init__(max_queue)
        self.post = post

    def _enqueue(self, job: Callable[[], None]) -> None:
        self.post(job)

    def close(self) -> None:
        """Take no new work (what is posted still runs on the owner's thread)."""
        with self._lock:
            self._closed = True
