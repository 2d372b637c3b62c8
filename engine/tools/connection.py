"""One configured MCP server and its current run on the host's loop: the stdio or HTTP transport, the session
held open by an owner task until it is told to stop (the SDK's task groups must be entered and left by one
task), the stderr tail of a stdio server, and why a start failed or a ready server stopped, in plain words."""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import math
import os
import threading
from collections.abc import Iterable
from contextlib import AsyncExitStack

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from engine import __version__
from engine.tools.config import HTTP, ToolRegistry, ToolServerConfig
from engine.tools.listing import Listed, Screen, list_tools, plain_validation
from engine.tools.specs import (
    HTTP_READ_TIMEOUT_S,
    HTTP_TIMEOUT_S,
    PROBE_TIMEOUT_S,
    STDERR_SETTLE_S,
    STDERR_TAIL_BYTES,
    STOP_TIMEOUT_S,
    ServerState,
    describe,
    one_line,
    redact,
)

log = logging.getLogger(__name__)

CLIENT_INFO = types.Implementation(name="hearth", version=__version__)


class StderrTail:
    """A server's stderr, read from a pipe on a thread of its own (portable: the loop needs no pipe support),
    keeping only the last few KiB. EOF means every process holding the pipe, the server first, has ended."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        read_fd, write_fd = os.pipe()
        self._loop = loop
        self.closed = asyncio.Event()  # the loop's view of EOF (made on the loop's thread)
        self.writer = os.fdopen(write_fd, "w")  # the child's stderr; ours closes once the child holds it
        self._read_fd = read_fd
        self._lock = threading.Lock()
        self._buf = bytearray()
        self.eof = threading.Event()
        threading.Thread(target=self._pump, name="mcp-stderr", daemon=True).start()

    def _pump(self) -> None:
        try:
            while data := os.read(self._read_fd, 65536):
                with self._lock:
                    self._buf += data
                    if len(self._buf) > 4 * STDERR_TAIL_BYTES:  # twice over, so redaction sees whole secrets
                        del self._buf[:-2 * STDERR_TAIL_BYTES]
        except OSError:
            pass
        finally:
            os.close(self._read_fd)
            self.eof.set()
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                self._loop.call_soon_threadsafe(self.closed.set)

    def close_writer(self) -> None:
        with contextlib.suppress(OSError):
            self.writer.close()

    def text(self, secrets: Iterable[str]) -> str:
        with self._lock:
            raw = bytes(self._buf)
        text = redact(raw.decode("utf-8", "replace"), secrets)
        tail = text.encode("utf-8")[-STDERR_TAIL_BYTES:].decode("utf-8", "ignore")
        return tail.strip("\n")


class Server:
    """One configured server and its current run; touched only on the loop's thread."""

    def __init__(self, config: ToolServerConfig) -> None:
        self.config = config
        self.state = ServerState.STOPPED
        self.error = ""
        self.listed: tuple[Listed, ...] = ()  # kept after a failure, so function names stay put
        self.client: Client | None = None
        self.secrets: tuple[str, ...] = ()
        self.tail: StderrTail | None = None
        self.task: asyncio.Task | None = None  # the owner task of the current run
        self.started: asyncio.Future | None = None  # done when the current start ends, either way
        self.stop: asyncio.Event | None = None  # set to end the current run
        self.start_scope: anyio.CancelScope | None = None
        self.retry = False  # it crashed after it was ready: the next call starts it again, once
        self.generation = 0
        self.breaks: set[asyncio.Future] = set()  # in-flight calls, told when the server writes non-JSON-RPC
        self.running: list[str] = []  # the tools called now
        self.http_status = 0  # the last HTTP error status an http server answered with
        self.protocol_error = ""

    def stderr_tail(self) -> str:
        return self.tail.text(self.secrets) if self.tail else ""

    # --- starting and stopping --------------------------------------------------------------------------

    def signal_stop(self) -> None:
        if self.stop is not None:
            self.stop.set()
        if self.state is ServerState.STARTING and self.start_scope is not None:
            self.start_scope.cancel()  # a start does not watch its stop event; its scope ends it

    async def start_run(self, registry: ToolRegistry, start_timeout_s: float) -> None:
        """Start a run and wait until it is ready or has failed (its owner task goes on holding it open)."""
        if self.task is not None and not self.task.done():  # the last run is still winding down
            await self.stop_run()
        loop = asyncio.get_running_loop()
        self.generation += 1
        self.state = ServerState.STARTING
        self.error = self.protocol_error = ""
        self.tail = None  # the last run's stderr goes with it
        self.stop = asyncio.Event()
        self.started = loop.create_future()
        self.task = loop.create_task(self._run(registry, start_timeout_s, self.generation, self.started, self.stop))
        await asyncio.shield(self.started)

    async def stop_run(self) -> None:
        """End the current run and wait for it (cancelled when it takes too long)."""
        self.signal_stop()
        task = self.task
        if task is not None and not task.done():
            _done, pending = await asyncio.wait({task}, timeout=STOP_TIMEOUT_S)
            if pending:
                task.cancel()
                await asyncio.wait({task}, timeout=2.0)
        self.state = ServerState.STOPPED
        self.client = None

    def _transport(self, registry: ToolRegistry):
        """The SDK transport for this server (and the HTTP client it needs entered first, for http)."""
        config = self.config
        if config.transport == HTTP:
            headers = registry.headers_of(config.name)
            self.secrets = tuple(headers.values())
            # the SDK's own defaults (30 s to connect, 5 min to read a response stream); Hearth's call timeout
            # and Stop end a call sooner
            http_client = httpx2.AsyncClient(headers=dict(headers) or None,
                                             timeout=httpx2.Timeout(HTTP_TIMEOUT_S, read=HTTP_READ_TIMEOUT_S))
            self.http_status = 0

            async def note_status(response) -> None:  # the SDK reports a refusal without its HTTP status
                if response.status_code >= 400:
                    self.http_status = response.status_code

            http_client.event_hooks["response"].append(note_status)
            return http_client, streamable_http_client(config.url, http_client=http_client)
        env = registry.env_of(config.name)
        self.secrets = tuple(env.values())
        self.tail = StderrTail(asyncio.get_running_loop())
        # the SDK merges env onto its own short list of safe variables (PATH, HOME, ...), never our whole env
        params = StdioServerParameters(command=config.command, args=list(config.args), env=dict(env) or None,
                                       cwd=config.cwd or None)
        return None, stdio_client(params, errlog=self.tail.writer)

    async def _run(self, registry: ToolRegistry, start_timeout_s: float, generation: int, started: asyncio.Future,
                   stop: asyncio.Event) -> None:
        """A server's whole run, in one task: connect, list its tools, wait to be told to stop, disconnect."""
        name = self.config.name
        scope = anyio.CancelScope(deadline=anyio.current_time() + start_timeout_s)
        self.start_scope = scope
        ready = False
        failure: BaseException | None = None
        try:
            try:
                with scope:
                    async with AsyncExitStack() as stack:
                        http_client, transport = self._transport(registry)
                        if http_client is not None:
                            await stack.enter_async_context(http_client)
                        client = Client(Screen(name).wrap(transport), cache=None, client_info=CLIENT_INFO,
                                        message_handler=self._message_handler(generation))
                        try:
                            await stack.enter_async_context(client)
                        finally:
                            if self.tail is not None:
                                self.tail.close_writer()  # the child holds its own copy now
                        listed = await list_tools(client)
                        scope.deadline = math.inf  # ready: the start timeout no longer applies
                        self.listed, self.client, self.state = listed, client, ServerState.READY
                        ready = True
                        log.info("tool server %r is ready with %d tools", name, len(listed))
                        settle(started)
                        await self._watch(generation, client, stop)
            except Exception as exc:  # every failure of a server becomes its FAILED state
                failure = leaf(exc)
            finally:
                self.start_scope = None
                if self.tail is not None:
                    self.tail.close_writer()
            if self.generation != generation:
                return
            self.client = None
            if not ready:
                reason = self._start_failure(failure, start_timeout_s, timed_out=scope.cancelled_caught,
                                             stopped=stop.is_set())
                if reason:
                    await self._settle_stderr()
                    self.state, self.error = ServerState.FAILED, redact(one_line(reason), self.secrets)
                    log.warning("tool server %r failed to start: %s", name, self.error)
                else:
                    self.state = ServerState.STOPPED
            elif self.state is ServerState.READY:  # not a crash (that set FAILED already)
                if failure is not None and not stop.is_set():
                    self.state, self.retry = ServerState.FAILED, True
                    self.error = redact(one_line(f"the connection to the server broke: {describe(failure)}"),
                                        self.secrets)
                else:
                    self.state = ServerState.STOPPED
        except BaseException:  # cancelled (close, or a stop that took too long)
            if self.generation == generation:
                self.state, self.client = ServerState.STOPPED, None
            raise
        finally:
            settle(started)

    def _start_failure(self, exc: BaseException | None, start_timeout_s: float, *, timed_out: bool,
                       stopped: bool) -> str:
        """Why a start failed, in plain words; "" when it was told to stop."""
        config = self.config
        if self.protocol_error:
            return f"the server wrote something that is not JSON-RPC: {self.protocol_error}"
        if stopped:
            return ""
        if timed_out:
            return f"the server did not become ready within {start_timeout_s:g} s"
        if isinstance(exc, FileNotFoundError) and config.cwd and exc.filename == config.cwd:
            return f"the server's working folder {config.cwd!r} does not exist"
        if isinstance(exc, FileNotFoundError):
            return f"the program {config.command!r} was not found"
        if isinstance(exc, PermissionError):
            return f"the program {config.command!r} cannot be run (permission denied)"
        if isinstance(exc, OSError) and config.transport != HTTP and not isinstance(exc, ConnectionError):
            return f"the program {config.command!r} could not be started: {exc.strerror or exc}"
        if config.transport == HTTP and self.http_status:
            return f"the server at {config.url} answered HTTP {http_status_text(self.http_status)}" + (
                " (are its headers right?)" if self.http_status in (401, 403) else "")
        if isinstance(exc, MCPError) and exc.error.code == types.CONNECTION_CLOSED:
            if config.transport == HTTP:
                return f"the server at {config.url} closed the connection before it was ready"
            return "the server exited before it was ready (its stderr may say why)"
        if isinstance(exc, MCPError):
            return f"the server refused to start a session: {exc.error.message}"
        if config.transport == HTTP:
            return f"could not reach {config.url}: {describe(exc)}"
        return f"the server could not be started: {describe(exc)}"

    # --- while it runs ----------------------------------------------------------------------------------

    async def _watch(self, generation: int, client: Client, stop: asyncio.Event) -> None:
        """Hold the run open until told to stop. A stdio server whose stderr closes has most likely exited:
        a tools/list tells, and a dead one is marked FAILED at once (not only at the next call)."""
        stopping = asyncio.ensure_future(stop.wait())
        try:
            if self.tail is not None:
                closed = asyncio.ensure_future(self.tail.closed.wait())
                try:
                    await asyncio.wait({stopping, closed}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    closed.cancel()
                if not stop.is_set():
                    try:
                        await asyncio.wait_for(client.list_tools(), PROBE_TIMEOUT_S)
                    except Exception:  # any failure here means it is gone
                        why = (f"the server stopped while it ran the tool {self.running[0]!r}" if self.running
                               else "the server stopped on its own")
                        await self.crashed(generation, why)
                        return
            await stopping
        finally:
            stopping.cancel()

    async def crashed(self, generation: int, why: str) -> None:
        """A ready server's connection ended: FAILED with its stderr tail; the next call starts it again once."""
        if self.generation != generation or self.state is not ServerState.READY or (self.stop and self.stop.is_set()):
            return  # already known, or it is being stopped on purpose
        self.state, self.retry, self.client = ServerState.FAILED, True, None
        self.error = redact(why, self.secrets)
        if self.stop is not None:
            self.stop.set()
        await self._settle_stderr()
        log.warning("tool server %r stopped: %s", self.config.name, self.error)

    async def _settle_stderr(self) -> None:
        """Give a stopped server's last stderr lines a moment to arrive (they tell why it stopped)."""
        if self.tail is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.tail.closed.wait(), STDERR_SETTLE_S)

    def _message_handler(self, generation: int):
        async def handle(message) -> None:
            if self.generation != generation:
                return
            if isinstance(message, Exception):
                # a line that is not JSON-RPC: fail the calls waiting now (their answer may never come)
                text = plain_validation(message) if isinstance(message, ValidationError) else describe(message)
                self.protocol_error = one_line(redact(text, self.secrets), 300)
                log.warning("tool server %r wrote something that is not JSON-RPC: %s", self.config.name,
                            self.protocol_error)
                for waiter in list(self.breaks):
                    if not waiter.done():
                        waiter.set_result(self.protocol_error)
                if self.state is ServerState.STARTING and self.start_scope is not None:
                    self.start_scope.cancel()
            # notifications (a changed tool list among them) are let go: restart() lists a server's tools afresh
        return handle


def leaf(exc: BaseException) -> BaseException:
    """The first real exception inside task groups' exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def http_status_text(code: int) -> str:
    """An HTTP status with its phrase, e.g. "401 (Unauthorized)"."""
    try:
        return f"{code} ({http.HTTPStatus(code).phrase})"
    except ValueError:
        return str(code)


def settle(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
