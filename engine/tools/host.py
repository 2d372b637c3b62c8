"""The running MCP servers: started when a chat first needs them, stopped with the app, each with its state
and tools; a call runs with a timeout and Stop, and every failure becomes a readable ``ToolOutcome``.

One asyncio loop on a daemon thread owns every server (the ``mcp`` SDK is async; its transports' task groups
must be entered and left by one task, so each server has an owner task that holds its connection open until
it is told to stop). The public methods are blocking and thread-safe: they hand a coroutine to the loop and
wait, polling the caller's CancelToken, so Stop ends a wait at once. A server's stderr goes through a pipe
into a bounded tail (never the app's own stderr), and the secrets a server was given (its environment's
values, its headers) are blotted out of every error, stderr tail and log line."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http
import json
import logging
import math
import os
import re
import threading
import time
import weakref
from collections.abc import Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from enum import StrEnum

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from engine import __version__
from engine.tools.config import HTTP, ToolConfigError, ToolRegistry, ToolServerConfig
from engine.tools.results import result_text
from engine.types import CancelToken

log = logging.getLogger(__name__)

DEFAULT_CALL_TIMEOUT_S = 60.0
DEFAULT_START_TIMEOUT_S = 30.0
MAX_RESULT_CHARS = 32_000  # what one result may give the model; the rest is cut with a note saying so

MAX_TOOLS_PER_SERVER = 128
MAX_TOOLS_EXAMINED = 4 * MAX_TOOLS_PER_SERVER  # a listing of thousands of unusable tools is not read to its end
MAX_TOOL_NAME_CHARS = 256  # MCP asks for 1-128; the function name is cut to 64 anyway
MAX_TOOL_JSON_CHARS = 64 * 1024  # one tool's listing (name, description, schema) as JSON
MAX_DESCRIPTION_CHARS = 4 * 1024
MAX_LIST_PAGES = 16  # tools/list pages followed; a paginator that never ends cannot hang a start
MAX_FUNCTION_CHARS = 64  # OpenAI's function names: 1-64 of [a-zA-Z0-9_-]
STDERR_TAIL_BYTES = 4 * 1024
REDACTED = "•••"
POLL_S = 0.05  # how often a waiting caller looks at its CancelToken
STDERR_SETTLE_S = 2.0  # after a server stopped, how long to wait for the rest of its stderr
PROBE_TIMEOUT_S = 5.0  # a liveness check (tools/list) after a timed-out call or a closed stderr
CALL_GRACE_S = 5.0  # past the call's own timeout, how long before the host gives up on the SDK's answer
STOP_TIMEOUT_S = 12.0  # the SDK stops a stdio server in at most ~6 s (stdin closed, SIGTERM, SIGKILL)
MAX_ERROR_CHARS = 600
HTTP_TIMEOUT_S = 30.0
HTTP_READ_TIMEOUT_S = 300.0

CLIENT_INFO = types.Implementation(name="hearth", version=__version__)
_FUNCTION_BAD = re.compile(r"[^a-zA-Z0-9_-]")


class ServerState(StrEnum):
    STOPPED = "stopped"  # not started yet (or stopped)
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"


@dataclass(frozen=True)
class ToolSpec:
    """One tool as its server lists it, and the function name the model is offered for it (unique across
    servers, OpenAI's 1–64 of [a-zA-Z0-9_-])."""

    server: str
    name: str  # the MCP tool's own name
    function: str  # what the model calls
    description: str
    parameters: dict  # the input JSON schema (an object schema)
    enabled: bool = True  # the person's switch (config's disabled_tools)

    def openai(self) -> dict:
        """The tool as a chat request offers it (``TurnRequest.tools``)."""
        return {"type": "function", "function": {"name": self.function, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ServerStatus:
    name: str
    state: ServerState
    tools: tuple[ToolSpec, ...] = ()
    error: str = ""  # why it failed, in plain words
    stderr_tail: str = ""  # the last few KiB of its stderr (stdio)


@dataclass(frozen=True)
class ToolOutcome:
    """What a call gave: the text the model and the person read (bounded), whether it is an error."""

    text: str
    is_error: bool = False
    cut_from: int | None = None  # the result's length in characters when it was cut to MAX_RESULT_CHARS
    elapsed_ms: int = 0


# --- small helpers ------------------------------------------------------------------------------------------


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret value replaced by •••; the longest first, so one that holds another goes whole."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def sanitize_function(name: str) -> str:
    """An MCP tool's name as an OpenAI function name: other characters become '_', at most 64, never empty."""
    return _FUNCTION_BAD.sub("_", name)[:MAX_FUNCTION_CHARS] or "tool"


def _unique(name: str, used: set[str]) -> str:
    n = 2
    candidate = name
    while candidate in used:
        suffix = f"_{n}"
        candidate = name[:MAX_FUNCTION_CHARS - len(suffix)] + suffix
        n += 1
    return candidate


def _leaf(exc: BaseException) -> BaseException:
    """The first real exception inside task groups' exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _one_line(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


class _StderrTail:
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


@dataclass(frozen=True)
class _Listed:
    """A tool as its server listed it, checked and bounded."""

    name: str
    description: str
    parameters: dict


class _Server:
    """One configured server and its current run; touched only on the loop's thread."""

    def __init__(self, config: ToolServerConfig) -> None:
        self.config = config
        self.state = ServerState.STOPPED
        self.error = ""
        self.listed: tuple[_Listed, ...] = ()  # kept after a failure, so function names stay put
        self.client: Client | None = None
        self.secrets: tuple[str, ...] = ()
        self.tail: _StderrTail | None = None
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


class _Core:
    """The loop, its thread and the servers, with everything that runs on the loop. It never refers to the
    ToolHost, so a host nobody closed can be collected, and its finalizer (which holds only this) stops
    the servers."""

    def __init__(self, registry: ToolRegistry, start_timeout_s: float, max_result_chars: int) -> None:
        self.registry = registry
        self.start_timeout_s = start_timeout_s
        self.max_result_chars = max_result_chars
        self.loop = asyncio.new_event_loop()
        self.servers: dict[str, _Server] = {}
        self.retiring: set[asyncio.Task] = set()  # runs being stopped in the background, probes
        self.closed = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run_loop, name="mcp-host", daemon=True)
        self.thread.start()

    # --- the loop and its end ---------------------------------------------------------------------------

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(asyncio.sleep(0))
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    async def stop_all(self) -> None:
        tasks = list(self.retiring)
        for srv in self.servers.values():
            self._signal_stop(srv)
            if srv.task is not None:
                tasks.append(srv.task)
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=2.0)
        for srv in self.servers.values():
            srv.state = ServerState.STOPPED
            srv.client = None

    def shutdown(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        if threading.current_thread() is self.thread:  # a finalizer run by the loop's own thread: cannot wait
            task = self.loop.create_task(self.stop_all())
            task.add_done_callback(lambda _t: self.loop.stop())
            return
        if self.loop.is_running():
            fut = asyncio.run_coroutine_threadsafe(self.stop_all(), self.loop)
            with contextlib.suppress(Exception):
                fut.result(timeout=STOP_TIMEOUT_S + 5)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)

    def closed_statuses(self) -> list[ServerStatus]:
        return [ServerStatus(srv.config.name, ServerState.STOPPED) for srv in self.servers.values()]

    # --- following the registry -------------------------------------------------------------------------

    def sync(self) -> None:
        """Follow the registry: new servers come in STOPPED, removed ones stop, a changed command, address or
        environment stops the old run (in the background) and leaves a fresh STOPPED entry; a server switched
        off stops."""
        configs = self.registry.servers()
        servers = self.servers
        fresh: dict[str, _Server] = {}
        for config in configs:
            old = servers.pop(config.name, None)
            if old is None:
                fresh[config.name] = _Server(config)
                continue
            if _same_run(old.config, config):
                old.config = config  # only its switches changed (its listing stays: names stay put)
                if not config.enabled and old.state in (ServerState.READY, ServerState.STARTING):
                    self._retire(old)
                fresh[config.name] = old
            else:
                self._retire(old)
                fresh[config.name] = _Server(config)
        for gone in servers.values():
            self._retire(gone)
        self.servers = fresh

    def _signal_stop(self, srv: _Server) -> None:
        if srv.stop is not None:
            srv.stop.set()
        if srv.state is ServerState.STARTING and srv.start_scope is not None:
            srv.start_scope.cancel()  # a start does not watch its stop event; its scope ends it

    def _retire(self, srv: _Server) -> None:
        """Stop ``srv``'s run in the background (a start waits for it to end)."""
        self._signal_stop(srv)
        if srv.task is not None and not srv.task.done():
            self._keep(srv.task)
        srv.state, srv.client = ServerState.STOPPED, None

    def _keep(self, task: asyncio.Task) -> None:
        self.retiring.add(task)
        task.add_done_callback(self.retiring.discard)

    # --- what status() shows ----------------------------------------------------------------------------

    def assign(self) -> dict[str, list[ToolSpec]]:
        """Every listed tool's function name: its own (sanitised) unless another server lists the same, then
        prefixed with its server's name; unique and at most 64 characters either way."""
        entries = [(srv, item) for srv in self.servers.values() for item in srv.listed]
        base = [sanitize_function(item.name) for _srv, item in entries]
        owners: dict[str, set[str]] = {}
        for (srv, _item), name in zip(entries, base, strict=True):
            owners.setdefault(name, set()).add(srv.config.name)
        used: set[str] = set()
        specs: dict[str, list[ToolSpec]] = {name: [] for name in self.servers}
        for (srv, item), name in zip(entries, base, strict=True):
            if len(owners[name]) > 1:
                name = sanitize_function(f"{srv.config.name}_{item.name}")
            name = _unique(name, used)
            used.add(name)
            specs[srv.config.name].append(ToolSpec(
                server=srv.config.name, name=item.name, function=name, description=item.description,
                parameters=item.parameters, enabled=srv.config.tool_enabled(item.name)))
        return specs

    def statuses(self, names: tuple[str, ...] | None) -> list[ServerStatus]:
        specs = self.assign()
        return [ServerStatus(name=name, state=srv.state, tools=tuple(specs[name]),
                             error=srv.error if srv.state is ServerState.FAILED else "",
                             stderr_tail=srv.stderr_tail())
                for name, srv in self.servers.items() if names is None or name in names]

    async def status(self, names: tuple[str, ...] | None) -> list[ServerStatus]:
        self.sync()
        return self.statuses(names)

    # --- starting and stopping --------------------------------------------------------------------------

    async def ensure(self, names: tuple[str, ...] | None) -> list[ServerStatus]:
        self.sync()
        wanted = [srv for name, srv in self.servers.items()
                  if srv.config.enabled and (names is None or name in names)]
        await asyncio.gather(*(self._ready(srv) for srv in wanted))
        return self.statuses(names)

    async def restart(self, name: str) -> ServerStatus:
        self.sync()
        srv = self.servers.get(name)
        if srv is None:
            raise ToolConfigError(f"there is no tool server named {name!r}")
        await self._stop(srv)
        srv.retry = False
        if srv.config.enabled:  # a server switched off is only stopped
            await self._start(srv)
        return self.statuses((name,))[0]

    async def _ready(self, srv: _Server) -> bool:
        """Whether ``srv`` is ready, starting it when it is stopped (or crashed, once)."""
        if srv.state is ServerState.READY:
            return True
        if srv.state is ServerState.STARTING and srv.started is not None:
            await asyncio.shield(srv.started)
            return srv.state is ServerState.READY
        if srv.state is ServerState.FAILED and not srv.retry:
            return False
        srv.retry = False
        await self._start(srv)
        return srv.state is ServerState.READY

    async def _start(self, srv: _Server) -> None:
        if srv.task is not None and not srv.task.done():  # the last run is still winding down
            await self._stop(srv)
        loop = asyncio.get_running_loop()
        srv.generation += 1
        srv.state = ServerState.STARTING
        srv.error = srv.protocol_error = ""
        srv.tail = None  # the last run's stderr goes with it
        srv.stop = asyncio.Event()
        srv.started = loop.create_future()
        srv.task = loop.create_task(self._run(srv, srv.generation, srv.started, srv.stop))
        await asyncio.shield(srv.started)

    async def _stop(self, srv: _Server) -> None:
        self._signal_stop(srv)
        task = srv.task
        if task is not None and not task.done():
            _done, pending = await asyncio.wait({task}, timeout=STOP_TIMEOUT_S)
            if pending:
                task.cancel()
                await asyncio.wait({task}, timeout=2.0)
        srv.state = ServerState.STOPPED
        srv.client = None

    def _transport(self, srv: _Server):
        """The SDK transport for ``srv`` (and the HTTP client it needs entered first, for http)."""
        config = srv.config
        if config.transport == HTTP:
            headers = self.registry.headers_of(config.name)
            srv.secrets = tuple(headers.values())
            # the SDK's own defaults (30 s to connect, 5 min to read a response stream); Hearth's call timeout
            # and Stop end a call sooner
            http_client = httpx2.AsyncClient(headers=dict(headers) or None,
                                             timeout=httpx2.Timeout(HTTP_TIMEOUT_S, read=HTTP_READ_TIMEOUT_S))
            srv.http_status = 0

            async def note_status(response) -> None:  # the SDK reports a refusal without its HTTP status
                if response.status_code >= 400:
                    srv.http_status = response.status_code

            http_client.event_hooks["response"].append(note_status)
            return http_client, streamable_http_client(config.url, http_client=http_client)
        env = self.registry.env_of(config.name)
        srv.secrets = tuple(env.values())
        srv.tail = _StderrTail(self.loop)
        # the SDK merges env onto its own short list of safe variables (PATH, HOME, ...), never our whole env
        params = StdioServerParameters(command=config.command, args=list(config.args), env=dict(env) or None,
                                       cwd=config.cwd or None)
        return None, stdio_client(params, errlog=srv.tail.writer)

    async def _run(self, srv: _Server, generation: int, started: asyncio.Future, stop: asyncio.Event) -> None:
        """A server's whole run, in one task: connect, list its tools, wait to be told to stop, disconnect."""
        name = srv.config.name
        scope = anyio.CancelScope(deadline=anyio.current_time() + self.start_timeout_s)
        srv.start_scope = scope
        ready = False
        failure: BaseException | None = None
        try:
            try:
                with scope:
                    async with AsyncExitStack() as stack:
                        http_client, transport = self._transport(srv)
                        if http_client is not None:
                            await stack.enter_async_context(http_client)
                        client = Client(_Screen(name).wrap(transport), cache=None, client_info=CLIENT_INFO,
                                        message_handler=self._message_handler(srv, generation))
                        try:
                            await stack.enter_async_context(client)
                        finally:
                            if srv.tail is not None:
                                srv.tail.close_writer()  # the child holds its own copy now
                        listed = await self._list_tools(srv, client)
                        scope.deadline = math.inf  # ready: the start timeout no longer applies
                        srv.listed, srv.client, srv.state = listed, client, ServerState.READY
                        ready = True
                        log.info("tool server %r is ready with %d tools", name, len(listed))
                        _settle(started)
                        await self._watch(srv, generation, client, stop)
            except Exception as exc:  # every failure of a server becomes its FAILED state
                failure = _leaf(exc)
            finally:
                srv.start_scope = None
                if srv.tail is not None:
                    srv.tail.close_writer()
            if srv.generation != generation:
                return
            srv.client = None
            if not ready:
                reason = self._start_failure(srv, failure, timed_out=scope.cancelled_caught, stopped=stop.is_set())
                if reason:
                    await self._settle_stderr(srv)
                    srv.state, srv.error = ServerState.FAILED, redact(_one_line(reason), srv.secrets)
                    log.warning("tool server %r failed to start: %s", name, srv.error)
                else:
                    srv.state = ServerState.STOPPED
            elif srv.state is ServerState.READY:  # not a crash (that set FAILED already)
                if failure is not None and not stop.is_set():
                    srv.state, srv.retry = ServerState.FAILED, True
                    srv.error = redact(_one_line(f"the connection to the server broke: {_describe(failure)}"),
                                       srv.secrets)
                else:
                    srv.state = ServerState.STOPPED
        except BaseException:  # cancelled (close, or a stop that took too long)
            if srv.generation == generation:
                srv.state, srv.client = ServerState.STOPPED, None
            raise
        finally:
            _settle(started)

    def _start_failure(self, srv: _Server, exc: BaseException | None, *, timed_out: bool, stopped: bool) -> str:
        """Why a start failed, in plain words; "" when it was told to stop."""
        config = srv.config
        if srv.protocol_error:
            return f"the server wrote something that is not JSON-RPC: {srv.protocol_error}"
        if stopped:
            return ""
        if timed_out:
            return f"the server did not become ready within {self.start_timeout_s:g} s"
        if isinstance(exc, FileNotFoundError) and config.cwd and exc.filename == config.cwd:
            return f"the server's working folder {config.cwd!r} does not exist"
        if isinstance(exc, FileNotFoundError):
            return f"the program {config.command!r} was not found"
        if isinstance(exc, PermissionError):
            return f"the program {config.command!r} cannot be run (permission denied)"
        if isinstance(exc, OSError) and config.transport != HTTP and not isinstance(exc, ConnectionError):
            return f"the program {config.command!r} could not be started: {exc.strerror or exc}"
        if config.transport == HTTP and srv.http_status:
            return f"the server at {config.url} answered HTTP {_http_status(srv.http_status)}" + (
                " (are its headers right?)" if srv.http_status in (401, 403) else "")
        if isinstance(exc, MCPError) and exc.error.code == types.CONNECTION_CLOSED:
            if config.transport == HTTP:
                return f"the server at {config.url} closed the connection before it was ready"
            return "the server exited before it was ready (its stderr may say why)"
        if isinstance(exc, MCPError):
            return f"the server refused to start a session: {exc.error.message}"
        if config.transport == HTTP:
            return f"could not reach {config.url}: {_describe(exc)}"
        return f"the server could not be started: {_describe(exc)}"

    async def _watch(self, srv: _Server, generation: int, client: Client, stop: asyncio.Event) -> None:
        """Hold the run open until told to stop. A stdio server whose stderr closes has most likely exited:
        a tools/list tells, and a dead one is marked FAILED at once (not only at the next call)."""
        stopping = asyncio.ensure_future(stop.wait())
        try:
            if srv.tail is not None:
                closed = asyncio.ensure_future(srv.tail.closed.wait())
                try:
                    await asyncio.wait({stopping, closed}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    closed.cancel()
                if not stop.is_set():
                    try:
                        await asyncio.wait_for(client.list_tools(), PROBE_TIMEOUT_S)
                    except Exception:  # any failure here means it is gone
                        why = (f"the server stopped while it ran the tool {srv.running[0]!r}" if srv.running
                               else "the server stopped on its own")
                        await self._crashed(srv, generation, why)
                        return
            await stopping
        finally:
            stopping.cancel()

    async def _crashed(self, srv: _Server, generation: int, why: str) -> None:
        """A ready server's connection ended: FAILED with its stderr tail; the next call starts it again once."""
        if srv.generation != generation or srv.state is not ServerState.READY or (srv.stop and srv.stop.is_set()):
            return  # already known, or it is being stopped on purpose
        srv.state, srv.retry, srv.client = ServerState.FAILED, True, None
        srv.error = redact(why, srv.secrets)
        if srv.stop is not None:
            srv.stop.set()
        await self._settle_stderr(srv)
        log.warning("tool server %r stopped: %s", srv.config.name, srv.error)

    async def _settle_stderr(self, srv: _Server) -> None:
        """Give a stopped server's last stderr lines a moment to arrive (they tell why it stopped)."""
        if srv.tail is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(srv.tail.closed.wait(), STDERR_SETTLE_S)

    def _message_handler(self, srv: _Server, generation: int):
        async def handle(message) -> None:
            if srv.generation != generation:
                return
            if isinstance(message, Exception):
                # a line that is not JSON-RPC: fail the calls waiting now (their answer may never come)
                text = _plain_validation(message) if isinstance(message, ValidationError) else _describe(message)
                srv.protocol_error = _one_line(redact(text, srv.secrets), 300)
                log.warning("tool server %r wrote something that is not JSON-RPC: %s", srv.config.name,
                            srv.protocol_error)
                for waiter in list(srv.breaks):
                    if not waiter.done():
                        waiter.set_result(srv.protocol_error)
                if srv.state is ServerState.STARTING and srv.start_scope is not None:
                    srv.start_scope.cancel()
            # notifications (a changed tool list among them) are let go: restart() lists a server's tools afresh
        return handle

    async def _list_tools(self, srv: _Server, client: Client) -> tuple[_Listed, ...]:
        """The server's tools, every page (the screen has left out those that cannot be offered)."""
        listed: list[_Listed] = []
        cursor: str | None = None
        for _page in range(MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            listed += [_Listed(tool.name, tool.description or "", tool.input_schema) for tool in page.tools]
            cursor = page.next_cursor
            if not cursor or len(listed) >= MAX_TOOLS_PER_SERVER:
                break
        return tuple(listed[:MAX_TOOLS_PER_SERVER])

    # --- calls ------------------------------------------------------------------------------------------

    async def call(self, function: str, args: dict, timeout: float) -> tuple[str, bool, int | None]:
        self.sync()
        spec = self._find(function)
        if spec is None:  # maybe a server that has not started yet lists it
            await asyncio.gather(*(self._ready(srv) for srv in self.servers.values()
                                   if srv.config.enabled and srv.state is ServerState.STOPPED))
            spec = self._find(function)
        if spec is None:
            return f"there is no tool named {function!r}", True, None
        srv = self.servers[spec.server]
        if not spec.enabled:
            return f"the tool {spec.name!r} of the server {spec.server!r} is switched off", True, None
        if not await self._ready(srv) or srv.client is None:
            why = srv.error or "it is not running"
            return f"the tool server {spec.server!r} is not available: {why}", True, None
        return await self._call_ready(srv, spec, args, timeout)

    def _find(self, function: str) -> ToolSpec | None:
        for specs in self.assign().values():
            for spec in specs:
                if spec.function == function:
                    return spec
        return None

    async def _call_ready(self, srv: _Server, spec: ToolSpec, args: dict,
                          timeout: float) -> tuple[str, bool, int | None]:
        client, generation, secrets = srv.client, srv.generation, srv.secrets
        assert client is not None
        srv.http_status = 0
        broke: asyncio.Future = asyncio.get_running_loop().create_future()
        srv.breaks.add(broke)
        srv.running.append(spec.name)
        call = asyncio.ensure_future(client.call_tool(spec.name, args, read_timeout_seconds=timeout))
        try:
            await asyncio.wait({call, broke}, timeout=timeout + CALL_GRACE_S, return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when the caller pressed Stop: the SDK tells the server the request is cancelled
            srv.breaks.discard(broke)
            srv.running.remove(spec.name)
            if not call.done():
                call.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait({call}, timeout=2.0)
        tool = f"{spec.name!r} of {spec.server!r}"
        answered = call.done() and not call.cancelled() and call.exception() is None
        if broke.done() and not answered:
            return f"the tool server {spec.server!r} sent a reply that is not valid JSON-RPC: {broke.result()}", True, None
        if call.cancelled() or not call.done():
            self._probe_later(srv, generation)
            return f"the tool {tool} did not answer within {timeout:g} s; the call was cancelled", True, None
        exc = call.exception()
        if exc is None:
            result = call.result()
            del call  # the result may be megabytes: only the part shown outlives this frame
            text, cut_from = result_text(result, self.max_result_chars)
            return text, bool(result.is_error), cut_from
        exc = _leaf(exc)
        closed = isinstance(exc, MCPError) and exc.error.code == types.CONNECTION_CLOSED
        # an HTTP server that went away or forgot the session (it restarted): the next call connects afresh
        http_broke = srv.config.transport == HTTP and (
            isinstance(exc, httpx2.TransportError | OSError | anyio.BrokenResourceError | anyio.ClosedResourceError)
            or isinstance(exc, MCPError) and exc.error.message == "Session terminated")
        if closed or http_broke:
            told_to_stop = srv.generation != generation or (
                srv.stop is not None and srv.stop.is_set() and srv.state is not ServerState.FAILED)
            if told_to_stop:
                return (f"the tool server {spec.server!r} was stopped (Hearth is closing, or the server was "
                        f"restarted) before the tool {spec.name!r} finished"), True, None
            if http_broke:
                why = f"the connection to the server broke: {_one_line(_describe(exc), 300)}"
                await self._crashed(srv, generation, why)
                return (f"the call to {tool} failed: {redact(why, secrets)}; Hearth connects again at the next call",
                        True, None)
            await self._crashed(srv, generation, f"the server stopped while it ran the tool {spec.name!r}")
            if srv.config.transport == HTTP:
                return (f"the connection to the tool server {spec.server!r} closed while it ran the tool "
                        f"{spec.name!r}; Hearth connects again at the next call"), True, None
            last = srv.stderr_tail().splitlines()[-1:]
            said = f" Its last words: {_one_line(last[0], 300)}" if last else ""
            return (f"the tool server {spec.server!r} stopped while it ran the tool {spec.name!r} (it may have "
                    f"crashed); Hearth starts it again at the next call.{said}"), True, None
        if isinstance(exc, MCPError) and exc.error.code == types.REQUEST_TIMEOUT:
            self._probe_later(srv, generation)
            return f"the tool {tool} did not answer within {timeout:g} s; the call was cancelled", True, None
        if isinstance(exc, MCPError):
            message = redact(_one_line(exc.error.message, 400), secrets)
            if srv.http_status:
                message += f", HTTP {_http_status(srv.http_status)}"
            return f"the tool server {spec.server!r} refused the call: {message} (error {exc.error.code})", True, None
        if isinstance(exc, ValidationError):
            return (f"the tool server {spec.server!r} answered with something that is not a valid tool result: "
                    f"{redact(_one_line(_plain_validation(exc), 400), secrets)}"), True, None
        log.warning("the call to %s failed: %s", tool, redact(_describe(exc), secrets))
        return f"the call to {tool} failed: {redact(_one_line(_describe(exc), 400), secrets)}", True, None

    def _probe_later(self, srv: _Server, generation: int) -> None:
        """After a timed-out call: a server that no longer answers at all is stopped (the next call starts it
        afresh); one that still answers is kept."""
        client = srv.client

        async def probe() -> None:
            if client is None:
                return
            try:
                await asyncio.wait_for(client.list_tools(), PROBE_TIMEOUT_S)
            except Exception:
                if srv.generation == generation and srv.state is ServerState.READY:
                    log.warning("tool server %r no longer answers after a timed-out call; it starts afresh at the "
                                "next call", srv.config.name)
                    await self._stop(srv)

        self._keep(asyncio.get_running_loop().create_task(probe()))


class _Stopped(Exception):
    """The caller's CancelToken was set while it waited (or the host closed meanwhile)."""


class ToolHost:
    """Thread-safe; its own asyncio loop on a daemon thread. Methods block their caller (never the UI thread)."""

    def __init__(self, registry: ToolRegistry, *, start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S, max_result_chars: int = MAX_RESULT_CHARS):
        self._call_timeout_s = float(call_timeout_s)
        self._core = _Core(registry, float(start_timeout_s), int(max_result_chars))
        # a host nobody closed still stops its servers: when it is collected, or when Python exits
        self._finalizer = weakref.finalize(self, self._core.shutdown)

    def status(self) -> list[ServerStatus]:
        """Every configured server's state now (no I/O)."""
        try:
            return self._wait(self._core.status(None))
        except _Stopped:
            return self._core.closed_statuses()

    def ensure(self, names: Iterable[str] | None = None, cancel: CancelToken | None = None) -> list[ServerStatus]:
        """Start the enabled servers (or those named) that are not running, list their tools; a failure is a
        FAILED status, never an exception. A server that failed to start stays FAILED until ``restart``; one
        that crashed after it was ready is started again, once. Stop ends the wait (a start goes on)."""
        wanted = None if names is None else tuple(names)
        try:
            return self._wait(self._core.ensure(wanted), cancel)
        except _Stopped:
            return self.status()

    def tools(self, names: Iterable[str] | None = None, cancel: CancelToken | None = None) -> list[ToolSpec]:
        """``ensure``, then the enabled tools of the ready servers."""
        statuses = self.ensure(names, cancel)
        return [spec for st in statuses if st.state is ServerState.READY for spec in st.tools if spec.enabled]

    def call(self, function: str, arguments: str, cancel: CancelToken | None = None,
             timeout_s: float | None = None) -> ToolOutcome:
        """Run the tool the model calls ``function`` with ``arguments`` (JSON text of an object). Never raises for
        the tool's or its server's failure: a crash, a hang past the timeout, Stop, invalid JSON-RPC, a huge
        result or a tool that raises come back as ``ToolOutcome(is_error=True)`` in plain words."""
        began = time.monotonic()

        def done(text: str, is_error: bool = True, cut_from: int | None = None) -> ToolOutcome:
            return ToolOutcome(text=text, is_error=is_error, cut_from=cut_from,
                               elapsed_ms=int((time.monotonic() - began) * 1000))

        try:
            args = json.loads(arguments) if arguments and arguments.strip() else {}
        except (ValueError, TypeError) as exc:
            return done(f"the arguments for {function!r} are not valid JSON ({_one_line(exc, 200)}); "
                        "send them as a JSON object")
        if not isinstance(args, dict):
            return done(f"the arguments for {function!r} must be a JSON object, not {_json_kind(args)}")
        timeout = self._call_timeout_s if timeout_s is None else float(timeout_s)
        try:
            text, is_error, cut_from = self._wait(self._core.call(function, args, timeout), cancel)
        except _Stopped:
            if self._core.closed:
                return done("the tool host is closed: no tool can run now")
            return done(f"stopped: the call to {function!r} was stopped before it finished")
        except ToolConfigError as exc:
            return done(f"the tools' configuration cannot be read: {exc}")
        return done(text, is_error, cut_from)

    def restart(self, name: str) -> ServerStatus:
        """Stop ``name`` if it runs and start it again (also after it failed to start)."""
        try:
            return self._wait(self._core.restart(name))
        except _Stopped:
            raise ToolConfigError("the tool host is closed") from None

    def close(self) -> None:
        """Stop every server (and the loop); idempotent."""
        self._finalizer()

    def _wait(self, coro, cancel: CancelToken | None = None):
        """Run ``coro`` on the loop and wait for it, looking at ``cancel`` every POLL_S."""
        if self._core.closed:
            coro.close()
            raise _Stopped
        try:
            fut = asyncio.run_coroutine_threadsafe(coro, self._core.loop)
        except RuntimeError:  # the loop closed meanwhile
            coro.close()
            raise _Stopped from None
        while True:
            try:
                return fut.result(timeout=POLL_S)
            except concurrent.futures.TimeoutError:
                if cancel is not None and cancel.cancelled:
                    fut.cancel()
                    raise _Stopped from None
                if not self._core.thread.is_alive():
                    raise _Stopped from None
            except concurrent.futures.CancelledError:  # the loop cancelled it on its way down (close)
                raise _Stopped from None


def _same_run(a: ToolServerConfig, b: ToolServerConfig) -> bool:
    """Whether two configurations start the same server (only switches differ)."""
    return (a.transport, a.command, a.args, a.env_names, a.cwd, a.url, a.header_names) == (
        b.transport, b.command, b.args, b.env_names, b.cwd, b.url, b.header_names)


def _http_status(code: int) -> str:
    try:
        return f"{code} ({http.HTTPStatus(code).phrase})"
    except ValueError:
        return str(code)


def _json_kind(value: object) -> str:
    return {list: "an array", str: "a string", bool: "true or false", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


class _Screen:
    """Sits between the SDK's transport and its session and screens every tools/list answer before the SDK
    validates it: the SDK refuses a whole listing for one bad tool, so a tool that cannot be offered (not an
    object schema, a listing over 64 KiB, not a tool at all) is left out here with a log line saying why,
    descriptions are cut to 4 KiB and a page past the 128th tool is dropped, before pydantic builds anything."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.list_ids: set[str] = set()  # tools/list requests sent and not yet answered
        self.kept = 0  # tools let through, over every page of a listing
        self.examined = 0  # tools looked at, kept or not

    def wrap(self, transport):
        screen = self

        @contextlib.asynccontextmanager
        async def screened():
            async with transport as (read_stream, write_stream):
                yield _ScreenedRead(read_stream, screen), _ScreenedWrite(write_stream, screen)

        return screened()

    def sent(self, item: SessionMessage) -> None:
        message = item.message
        if isinstance(message, types.JSONRPCRequest) and message.method == "tools/list":
            self.list_ids.add(str(message.id))
            if not (message.params or {}).get("cursor"):  # a listing from its first page: count afresh
                self.kept = self.examined = 0

    def received(self, item: object) -> None:
        if not isinstance(item, SessionMessage) or not isinstance(item.message, types.JSONRPCResponse):
            return
        key = str(item.message.id)
        if key not in self.list_ids:
            return
        self.list_ids.discard(key)
        result = item.message.result
        if isinstance(result, dict) and isinstance(result.get("tools"), list):
            result["tools"] = self._screen(result["tools"])

    def _screen(self, tools: list) -> list:
        kept = []
        for raw in tools:
            self.examined += 1
            if self.kept >= MAX_TOOLS_PER_SERVER or self.examined > MAX_TOOLS_EXAMINED:
                log.warning("tool server %r lists more than %d tools; the rest are left out", self.server,
                            MAX_TOOLS_PER_SERVER)
                break
            tool, why = _screen_tool(raw)
            if tool is None:
                name = raw.get("name") if isinstance(raw, dict) else None
                label = repr(name[:80]) if isinstance(name, str) else "without a name"
                log.warning("tool %s of server %r is left out: %s", label, self.server, why)
                continue
            kept.append(tool)
            self.kept += 1
        return kept


def _screen_tool(raw: object) -> tuple[dict | None, str]:
    """A listed tool fit to offer (its description cut to 4 KiB), or None and why not."""
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"]:
        return None, "it has no name"
    if len(raw["name"]) > MAX_TOOL_NAME_CHARS:
        return None, f"its name is longer than {MAX_TOOL_NAME_CHARS} characters"
    schema = raw.get("inputSchema")
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return None, "its input schema is not an object schema (a function's parameters must be an object)"
    description = raw.get("description")
    if description is not None and not isinstance(description, str):
        return None, "its description is not text"
    if description and len(description) > MAX_DESCRIPTION_CHARS:
        raw = {**raw, "description": description[:MAX_DESCRIPTION_CHARS]}
    try:
        size = len(json.dumps(raw, ensure_ascii=False))
    except (TypeError, ValueError):
        return None, "it is not plain JSON"
    if size > MAX_TOOL_JSON_CHARS:
        return None, f"its listing is {size:,} characters (at most {MAX_TOOL_JSON_CHARS:,})"
    try:
        types.Tool.model_validate(raw, by_name=False)
    except ValidationError as exc:
        return None, f"it is not a valid MCP tool ({_plain_validation(exc)})"
    return raw, ""


class _ScreenedRead:
    """The transport's read stream, with tools/list answers screened (``_Screen``)."""

    def __init__(self, inner, screen: _Screen) -> None:
        self._inner = inner
        self._screen = screen

    @property
    def last_context(self):  # the SDK reads the sender's context from an HTTP transport's stream
        return getattr(self._inner, "last_context", None)

    async def receive(self):
        item = await self._inner.receive()
        self._screen.received(item)
        return item

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self._inner.aclose()


class _ScreenedWrite:
    """The transport's write stream, noting which requests are tools/list (``_Screen``)."""

    def __init__(self, inner, screen: _Screen) -> None:
        self._inner = inner
        self._screen = screen

    async def send(self, item: SessionMessage, /) -> None:
        self._screen.sent(item)
        await self._inner.send(item)

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self._inner.aclose()


def _plain_validation(exc: ValidationError) -> str:
    """A pydantic error in a line: where and what, for the first few problems (no links, no type codes)."""
    parts = []
    for error in exc.errors()[:3]:
        where = ".".join(str(p) for p in error.get("loc", ()))
        text = error.get("msg", "invalid")
        value = error.get("input")
        if error.get("type") == "json_invalid" and isinstance(value, str):
            text += f" (the line began {value[:60]!r})"
        parts.append(f"{where}: {text}" if where else text)
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "an unknown error"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _settle(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


