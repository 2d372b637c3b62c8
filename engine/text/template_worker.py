"""A file's chat template renders in one long-lived child process, under a memory ceiling, killed past
its deadline.

The bounded sandbox (engine/text/template_limits.py) checks time and sizes between Python-level steps;
one C-level call is out of its reach: ``([[0]] * 1000000)|sum(start=[])`` copies lists for minutes, and
``'%s' * 2500 % ((s,) * 2500)`` built 2.67 GB before any check ran. A render that runs here instead is
stopped whatever it does: the address space is capped ``MEMORY_HEADROOM`` above where the child starts
(Linux), and the parent kills the child once a render runs ``GRACE_SECONDS`` past its own time limit.
Every render of a file's template goes through here, the trial at load and every turn's; the child is
started once (a spawn costs about a second on a busy machine, a render round trip well under a
millisecond) and again only after it was killed.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections import OrderedDict
from typing import Any

from engine.errors import PromptError, TemplateError, UnsupportedModelError

log = logging.getLogger(__name__)

START_SECONDS = 60.0  # starting an interpreter on a loaded machine; never the template's doing
GRACE_SECONDS = 1.0  # past the render's own limit: time for the sandbox to say which limit it hit
MEMORY_HEADROOM = 1 << 30  # bytes the child may map beyond what it has once started
_CACHED_TEMPLATES = 8  # compiled templates the child keeps (a model's own, plus the odd one in tests)
_ERRORS = {cls.__name__: cls for cls in (TemplateError, UnsupportedModelError, PromptError)}


class WorkerUnavailable(TemplateError):
    """The child could not be started at all (no process can be made here)."""


def _limit_memory() -> None:
    """Cap the child's address space a gigabyte above where it starts (Linux; elsewhere the kill alone)."""
    try:
        import os
        import resource

        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (mapped + MEMORY_HEADROOM, resource.RLIM_INFINITY))
    except (ImportError, OSError, ValueError):
        pass


def _serve(conn: Any) -> None:
    """The child: render each request, answer ("ok", text) or (error class name, message without a name)."""
    from engine.text.template_render import LocalTemplate

    _limit_memory()
    compiled: OrderedDict[tuple[str, str, str], LocalTemplate] = OrderedDict()
    conn.send(("ready", ""))
    while True:
        try:
            source, bos, eos, messages, add_generation_prompt, seconds, tools, variables = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        try:
            key = (source, bos, eos)
            template = compiled.get(key)
            if template is None:
                template = compiled[key] = LocalTemplate(source, bos, eos, name="")
                while len(compiled) > _CACHED_TEMPLATES:
                    compiled.popitem(last=False)
            compiled.move_to_end(key)
            answer = ("ok", "" if messages is None else template.render(messages, add_generation_prompt, seconds,
                                                                        tools=tools, variables=variables))
        except (TemplateError, UnsupportedModelError, PromptError) as exc:
            answer = (type(exc).__name__, str(exc).strip())
        except BaseException as exc:  # noqa: BLE001 (MemoryError under the ceiling: the answer must get back)
            answer = ("TemplateError", f"failed to render: {type(exc).__name__}")
        try:
            conn.send(answer)
        except (OSError, ValueError):
            return


class TemplateWorker:
    """The parent's handle on the child; one render at a time (renders take milliseconds)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: Any = None
        self._conn: Any = None

    def render(self, source: str, bos: str, eos: str, messages: list[dict] | None, add_generation_prompt: bool,
               seconds: float, tools: list[dict] | None = None, variables: dict | None = None) -> str:
        """The rendered text ("" for ``messages`` None: compile only); the template's own error (its class,
        its message without a subject), or a TemplateError when the child ran past ``seconds +
        GRACE_SECONDS`` or died."""
        with self._lock:
            self._start()
            try:
                self._conn.send((source, bos, eos, messages, add_generation_prompt, seconds, tools, variables or {}))
                answered = self._conn.poll(seconds + GRACE_SECONDS)
                answer = self._conn.recv() if answered else None
            except (EOFError, OSError):
                self._stop()
                raise TemplateError("killed the process that rendered it (out of memory?)") from None
            if answer is None:
                self._stop()
                raise TemplateError(f"took longer than {seconds + GRACE_SECONDS:g} s to render, so it was stopped")
        kind, value = answer
        if kind == "ok":
            return value
        raise _ERRORS.get(kind, TemplateError)(value)

    def _start(self) -> None:
        if self._process is not None and self._process.is_alive():
            return
        self._stop()
        ctx = multiprocessing.get_context("spawn")  # not fork: the parent may run ONNX Runtime or Qt threads
        receive, send = ctx.Pipe(duplex=True)
        process = ctx.Process(target=_serve, args=(send,), name="hearth-chat-template", daemon=True)
        try:
            process.start()
        except Exception as exc:  # noqa: BLE001 (e.g. inside a daemon process): no isolation possible here
            receive.close()
            send.close()
            raise WorkerUnavailable(f"cannot be rendered safely: no process to render it in ({exc})") from None
        send.close()
        self._process, self._conn = process, receive
        try:
            ready = receive.poll(START_SECONDS) and receive.recv()[0] == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            self._stop()
            raise WorkerUnavailable(f"cannot be rendered: the process to render it in did not start in {START_SECONDS:g} s")

    def _stop(self) -> None:
        process, conn, self._process, self._conn = self._process, self._conn, None, None
        if process is not None:
            if process.is_alive():
                process.kill()
            process.join(5)
        if conn is not None:
            conn.close()


_worker = TemplateWorker()


def render(source: str, bos: str, eos: str, messages: list[dict] | None, add_generation_prompt: bool,
           seconds: float, tools: list[dict] | None = None, variables: dict | None = None) -> str:
    """Render in this process's shared child (started on first use)."""
    return _worker.render(source, bos, eos, messages, add_generation_prompt, seconds, tools, variables)
