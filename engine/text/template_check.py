"""A file's chat template is tried once, in a child process under a time limit, before it is trusted.

The bounded sandbox (engine/text/template_limits.py) stops what it can see; a child process with a
hard timeout and a memory ceiling also stops what it cannot (one C-level call that runs for minutes).
The verdict is kept per template text for the life of the process, so a template costs one child.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import threading

from engine.errors import HearthError
from engine.text.chat_template import ChatTemplate, one_line

log = logging.getLogger(__name__)

CHILD_SECONDS = 15.0  # starting an interpreter on a busy machine, then a render that takes milliseconds
RENDER_SECONDS = 2.0  # the render itself, inside the child
MEMORY_HEADROOM = 1 << 30  # bytes the child may map beyond what it has once started

# A conversation every chat template should accept: alternating turns, no system message (some
# templates refuse one).
SAMPLE = [
    {"role": "user", "content": "Hello! Can you help me with something?"},
    {"role": "assistant", "content": "Of course. What do you need?"},
    {"role": "user", "content": "Write one sentence about the sea."},
]

_verdicts: dict[str, str] = {}  # sha256 of (template, bos, eos) → "" (it renders) or why not
_lock = threading.Lock()


def template_problem(source: str, bos: str = "", eos: str = "", seconds: float = CHILD_SECONDS) -> str:
    """"" when the template renders the sample conversation within its limits, else why not (one line)."""
    key = hashlib.sha256("\x00".join((source, bos, eos)).encode("utf-8", "surrogatepass")).hexdigest()
    with _lock:  # one check per template, even when two threads load the same model
        if key not in _verdicts:
            _verdicts[key] = _check(source, bos, eos, seconds)
            if _verdicts[key]:
                log.warning("chat template refused: %s", _verdicts[key])
        return _verdicts[key]


def trial_render(source: str, bos: str, eos: str, seconds: float = RENDER_SECONDS) -> str:
    """Compile and render the sample, with and without the generation prompt: "" or the failure."""
    try:
        template = ChatTemplate(source, bos, eos, name="it")
        template.render(SAMPLE, add_generation_prompt=True, seconds=seconds)
        template.render(SAMPLE[:2], add_generation_prompt=False, seconds=seconds)
    except HearthError as exc:
        return one_line(exc)
    except BaseException as exc:  # noqa: BLE001 (MemoryError under the ceiling, anything else the template provokes)
        return f"it failed: {type(exc).__name__}: {one_line(exc)}"
    return ""


def _child(conn, source: str, bos: str, eos: str) -> None:
    _limit_memory()
    try:
        verdict = trial_render(source, bos, eos)
    except BaseException as exc:  # noqa: BLE001 (the verdict must get back, whatever happened)
        verdict = f"it failed: {type(exc).__name__}"
    conn.send(verdict)
    conn.close()


def _limit_memory() -> None:
    """Cap the child's address space a gigabyte above where it starts (Linux; elsewhere the time limit)."""
    try:
        import os
        import resource

        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (mapped + MEMORY_HEADROOM, resource.RLIM_INFINITY))
    except (ImportError, OSError, ValueError):
        pass


def _check(source: str, bos: str, eos: str, seconds: float) -> str:
    ctx = multiprocessing.get_context("spawn")  # not fork: the parent may run ONNX Runtime or Qt threads
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_child, args=(send, source, bos, eos), name="hearth-template-check")
    try:
        process.start()
    except Exception as exc:  # noqa: BLE001 (no child here, e.g. inside a daemon process): the sandbox alone
        log.info("checking the chat template in this process: %s", exc)
        return trial_render(source, bos, eos)
    send.close()
    try:
        if not receive.poll(seconds):
            # A busy machine can be slow to start an interpreter: the verdict must not depend on the load
            # (a refused template changes every prompt, and so every saved context). The sandbox's own
            # limits still bound a render here; only what passes them is accepted.
            log.info("the template check process did not answer in %g s; checking in this process", seconds)
            problem = trial_render(source, bos, eos)
            return f"rendering it took longer than {seconds:g} s in a child process, and here: {problem}" if problem else ""
        try:
            return receive.recv()
        except EOFError:
            return "rendering it killed the process that tried it (out of memory?)"
    finally:
        if process.is_alive():
            process.kill()
        process.join()
        receive.close()
