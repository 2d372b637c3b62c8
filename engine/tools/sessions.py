"""The host's machinery: one asyncio loop on a daemon thread owns every configured server (``connection.py``),
follows the registry, starts servers when asked and runs calls on the ready ones, turning every failure of a
call (a crash, a hang, a reply that is not JSON-RPC, a refusal) into plain words. ``ToolHost`` (host.py)
hands coroutines to this loop; this module is imported only when a host starts, so the engine's façade does
not pay for the ``mcp`` SDK."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

import anyio
import httpx2
import mcp_types as types
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from engine.tools.config import HTTP, ToolConfigError, ToolRegistry, ToolServerConfig
from engine.tools.connection import Server, http_status_text, leaf
from engine.tools.listing import assign_functions, plain_validation
from engine.tools.results import result_text
from engine.tools.specs import (
    CALL_GRACE_S,
    PROBE_TIMEOUT_S,
    STOP_TIMEOUT_S,
    ServerState,
    ServerStatus,
    ToolSpec,
    describe,
    one_line,
    redact,
)

log = logging.getLogger(__name__)


class Core:
    """The loop, its thread and the servers, with everything that runs on the loop. It never refers to the
    ToolHost, so a host nobody closed can be collected, and its finalizer (which holds only this) stops
    the servers."""

    def __init__(self, registry: ToolRegistry, start_timeout_s: float, max_result_chars: int) -> None:
        self.registry = registry
        self.start_timeout_s = start_timeout_s
        self.max_result_chars = max_result_chars
        self.loop = asyncio.new_event_loop()
        self.servers: dict[str, Server] = {}
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
            srv.signal_stop()
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
        fresh: dict[str, Server] = {}
        for config in configs:
            old = servers.pop(config.name, None)
            if old is None:
                fresh[config.name] = Server(config)
                continue
            if _same_run(old.config, config):
                old.config = config  # only its switches changed (its listing stays: names stay put)
                if not config.enabled and old.state in (ServerState.READY, ServerState.STARTING):
                    self._retire(old)
                fresh[config.name] = old
            else:
                self._retire(old)
                fresh[config.name] = Server(config)
        for gone in servers.values():
            self._retire(gone)
        self.servers = fresh

    def _retire(self, srv: Server) -> None:
        """Stop ``srv``'s run in the background (a start waits for it to end)."""
        srv.signal_stop()
        if srv.task is not None and not srv.task.done():
            self._keep(srv.task)
        srv.state, srv.client = ServerState.STOPPED, None

    def _keep(self, task: asyncio.Task) -> None:
        self.retiring.add(task)
        task.add_done_callback(self.retiring.discard)

    # --- what status() shows ----------------------------------------------------------------------------

    def assign(self) -> dict[str, list[ToolSpec]]:
        """Every listed tool's function name, by server (``listing.assign_functions``)."""
        return assign_functions((srv.config, srv.listed) for srv in self.servers.values())

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
        await srv.stop_run()
        srv.retry = False
        if srv.config.enabled:  # a server switched off is only stopped
            await srv.start_run(self.registry, self.start_timeout_s)
        return self.statuses((name,))[0]

    async def _ready(self, srv: Server) -> bool:
        """Whether ``srv`` is ready, starting it when it is stopped (or crashed, once)."""
        if srv.state is ServerState.READY:
            return True
        if srv.state is ServerState.STARTING and srv.started is not None:
            await asyncio.shield(srv.started)
            return srv.state is ServerState.READY
        if srv.state is ServerState.FAILED and not srv.retry:
            return False
        srv.retry = False
        await srv.start_run(self.registry, self.start_timeout_s)
        return srv.state is ServerState.READY

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

    async def _call_ready(self, srv: Server, spec: ToolSpec, args: dict,
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
        exc = leaf(exc)
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
                why = f"the connection to the server broke: {one_line(describe(exc), 300)}"
                await srv.crashed(generation, why)
                return (f"the call to {tool} failed: {redact(why, secrets)}; Hearth connects again at the next call",
                        True, None)
            await srv.crashed(generation, f"the server stopped while it ran the tool {spec.name!r}")
            if srv.config.transport == HTTP:
                return (f"the connection to the tool server {spec.server!r} closed while it ran the tool "
                        f"{spec.name!r}; Hearth connects again at the next call"), True, None
            last = srv.stderr_tail().splitlines()[-1:]
            said = f" Its last words: {one_line(last[0], 300)}" if last else ""
            return (f"the tool server {spec.server!r} stopped while it ran the tool {spec.name!r} (it may have "
                    f"crashed); Hearth starts it again at the next call.{said}"), True, None
        if isinstance(exc, MCPError) and exc.error.code == types.REQUEST_TIMEOUT:
            self._probe_later(srv, generation)
            return f"the tool {tool} did not answer within {timeout:g} s; the call was cancelled", True, None
        if isinstance(exc, MCPError):
            message = redact(one_line(exc.error.message, 400), secrets)
            if srv.http_status:
                message += f", HTTP {http_status_text(srv.http_status)}"
            return f"the tool server {spec.server!r} refused the call: {message} (error {exc.error.code})", True, None
        if isinstance(exc, ValidationError):
            return (f"the tool server {spec.server!r} answered with something that is not a valid tool result: "
                    f"{redact(one_line(plain_validation(exc), 400), secrets)}"), True, None
        log.warning("the call to %s failed: %s", tool, redact(describe(exc), secrets))
        return f"the call to {tool} failed: {redact(one_line(describe(exc), 400), secrets)}", True, None

    def _probe_later(self, srv: Server, generation: int) -> None:
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
                    await srv.stop_run()

        self._keep(asyncio.get_running_loop().create_task(probe()))


def _same_run(a: ToolServerConfig, b: ToolServerConfig) -> bool:
    """Whether two configurations start the same server (only switches differ)."""
    return (a.transport, a.command, a.args, a.env_names, a.cwd, a.url, a.header_names) == (
        b.transport, b.command, b.args, b.env_names, b.cwd, b.url, b.header_names)
