"""MCP tool servers off the UI thread: the app's one ``ToolHost`` and every write to the tool registry.

The worker lives on its own thread. Quick work (reading and writing ``tools.json`` and the secret store)
runs there; what can block for long — starting servers, restarting one, a tool call — runs on a small pool
of threads beside it, so a server that takes its 30 seconds to fail never holds up Add, Remove or a
switch. While such work is in flight the worker looks at the host's states twice a second and reports a
change (a server "starting", then "ready" or "failed"), so the Preferences tab shows it as it happens.

Servers start when something asks for them (the Tools tab's Start, or a chat through ``prepare`` or
``call``), never when the app starts; they stop with the app (``ToolWorkerHost.stop``).

Every slot answers through signals; a failure is a plain sentence, never a traceback. A server's secrets
(environment values, HTTP headers) travel from the dialog to the registry (the secret store) and nowhere
else: not into a signal the window keeps, a log line or a message.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

from PySide6.QtCore import QCoreApplication, QObject, Qt, QThread, QTimer, Signal, Slot

from app.worker_guard import guarded
from engine.api import (
    ConversationStore,
    HearthPaths,
    ServerState,
    ServerStatus,
    ToolHost,
    ToolOutcome,
    ToolRegistry,
    open_conversations,
    run_call,
)
from engine.types import CancelToken, ToolCall

log = logging.getLogger(__name__)
BUSY_POLL_MS = 500  # how often the host's states are looked at while something may change them
IDLE_POLL_MS = 2000  # and otherwise, once servers may be running (one can crash on its own)
POOL_THREADS = 8  # starts, restarts and calls at once (several chats may call tools together)
CLOSING = "Not run: Hearth is closing."
CLOSE_WAIT_S = 5.0  # once the servers are stopped, how long the jobs still running get to end before the app quits


class ToolWorker(QObject):
    """Owns the app's ``ToolHost`` (made on first use: no server starts with the app)."""

    servers_listed = Signal(object)  # list[ToolServerConfig]: the configured servers (names of secrets only)
    status_changed = Signal(object)  # list[ServerStatus]: each configured server's state, tools and error
    # what was done ("add NAME", "import PATH", "remove NAME", "enable NAME", "tool NAME/TOOL", "start" and
    # "restart NAME" once they ended: a server's own failure is its FAILED state, not this), "" or why it failed
    changed = Signal(str, str)
    imported = Signal(object, object)  # the names of the servers an import added, the settings it ignored (lines)
    tools_ready = Signal(str, object)  # conversation, list[ToolSpec]: the enabled tools of the servers now ready
    call_finished = Signal(str, str, object)  # conversation, call id, ToolOutcome
    _job_done = Signal()  # from a pool thread: a start, restart or call ended

    def __init__(self, paths: HearthPaths):
        super().__init__()
        self.paths = paths
        self._registry: ToolRegistry | None = None
        self._host: ToolHost | None = None
        self._store: ConversationStore | None = None  # where calls' results go (thread-safe: one for the pool)
        self._pool: ThreadPoolExecutor | None = None
        self._busy = 0  # jobs in flight on the pool
        self._futures: set[Future] = set()
        self._last_status: list | None = None
        self._closed = False
        self._lock = threading.RLock()  # what is made on first use is made once, whichever thread asks first
        self._timer: QTimer | None = None
        self._job_done.connect(self._on_job_done)

    # what it owns ------------------------------------------------------------------------------------------
    @property
    def registry(self) -> ToolRegistry:
        with self._lock:
            if self._registry is None:
                self._registry = ToolRegistry(self.paths.data)
            return self._registry

    @property
    def host(self) -> ToolHost:
        with self._lock:
            if self._host is None:
                self._host = ToolHost(self.registry)
            return self._host

    @property
    def store(self) -> ConversationStore:
        with self._lock:
            if self._store is None:
                self._store = open_conversations(self.paths)
            return self._store

    def _guard(self, what: str, call) -> str:
        """Run ``call``; "" or why it failed, in words (app/worker_guard.py)."""
        return guarded(what, call)

    # reporting ---------------------------------------------------------------------------------------------
    @Slot()
    def refresh(self) -> None:
        """The configured servers and their states now (nothing is started)."""
        servers: list = []
        problem = self._guard("reading the tool servers", lambda: servers.extend(self.registry.servers()))
        if problem:
            self.changed.emit("list", problem)
        self.servers_listed.emit(servers)
        self._report_status(force=True)

    def _report_status(self, force: bool = False) -> None:
        if self._host is None:
            statuses = self._stopped_statuses()
        else:
            statuses = []
            problem = self._guard("reading the servers' states", lambda: statuses.extend(self._host.status()))
            if problem:
                self.changed.emit("status", problem)
                return
        if force or statuses != self._last_status:
            self._last_status = statuses
            self.status_changed.emit(statuses)

    def _stopped_statuses(self) -> list:
        """Before the host is made every server is stopped; asking the host would only say so."""
        servers: list = []
        self._guard("reading the tool servers", lambda: servers.extend(self.registry.servers()))
        return [ServerStatus(s.name, ServerState.STOPPED) for s in servers]

    def _poll(self) -> None:
        if self._timer is None:
            self._timer = QTimer(self)
            self._timer.timeout.connect(lambda: self._report_status())
        interval = BUSY_POLL_MS if self._busy else IDLE_POLL_MS
        if not self._timer.isActive() or self._timer.interval() != interval:
            self._timer.start(interval)

    # the registry: quick, on this thread ---------------------------------------------------------------------
    def _write(self, what: str, doing: str, call: Callable[[], object]) -> None:
        problem = self._guard(doing, call)
        self.changed.emit(what, problem)
        self.refresh()

    @Slot(str, str, object, object, str, bool)
    def add_stdio(self, name: str, command: str, args: list, env: dict, cwd: str, replace: bool = False) -> None:
        """A server run as a command (``args`` already split; ``env``'s values go to the secret store).
        ``replace``: an edit of the server ``name``, where a variable whose value is None keeps its kept value."""
        def run() -> None:
            values = self._kept(env, self.registry.env_of, name) if replace else dict(env)
            self.registry.add_stdio(name.strip(), command.strip(), list(args), env=values, cwd=cwd.strip() or None,
                                    replace=replace)

        self._write(f"add {name}", "keeping the server", run)

    @Slot(str, str, object, bool)
    def add_http(self, name: str, url: str, headers: dict, replace: bool = False) -> None:
        """A server reached over streamable HTTP (``headers``' values go to the secret store; on an edit a
        header whose value is None keeps its kept value)."""
        def run() -> None:
            values = self._kept(headers, self.registry.headers_of, name) if replace else dict(headers)
            self.registry.add_http(name.strip(), url.strip(), headers=values, replace=replace)

        self._write(f"add {name}", "keeping the server", run)

    @staticmethod
    def _kept(given: dict, kept_of: Callable[[str], dict], name: str) -> dict[str, str]:
        """The values of an edit: those typed, and the kept ones where the person left the value as it was."""
        kept = kept_of(name) if any(v is None for v in given.values()) else {}
        return {key: kept.get(key, "") if value is None else value for key, value in given.items()}

    @Slot(str)
    def import_file(self, path: str) -> None:
        """The servers of an ``mcp.json`` (Claude Desktop's / VS Code's shape), read here, never on the UI thread."""
        names: list = []
        notes: list = []
        problem = self._guard("importing the file",
                              lambda: names.extend(self.registry.import_servers(path, notes=notes)))
        if not problem:
            self.imported.emit(names, notes)
        self.changed.emit(f"import {path}", problem)
        self.refresh()

    @Slot(str)
    def remove(self, name: str) -> None:
        self._write(f"remove {name}", "removing the server", lambda: self.registry.remove(name))

    @Slot(str, bool)
    def set_enabled(self, name: str, enabled: bool) -> None:
        self._write(f"enable {name}", "switching the server", lambda: self.registry.set_enabled(name, enabled))

    @Slot(str, str, bool)
    def set_tool_enabled(self, name: str, tool: str, enabled: bool) -> None:
        self._write(f"tool {name}/{tool}", "switching the tool",
                    lambda: self.registry.set_tool_enabled(name, tool, enabled))

    # the host: may block, on the pool ----------------------------------------------------------------------------
    def _submit(self, job: Callable[[], None]) -> None:
        if self._closed:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="hearth-tool")
        self._busy += 1
        self._poll()
        future: Future = self._pool.submit(job)
        self._futures.add(future)
        future.add_done_callback(lambda f: (self._futures.discard(f), self._job_done.emit()))

    @Slot()
    def _on_job_done(self) -> None:
        if self._closed:
            return  # the app is quitting: no more looks at the host
        self._busy = max(self._busy - 1, 0)
        self._report_status()
        self._poll()

    @Slot(object)
    def ensure(self, names: list | None = None) -> None:
        """Start the enabled servers (or those named) that are not running; each ends ready or failed
        (``status_changed``), then ``changed("start", "")``."""
        chosen = None if names is None else list(names)
        self._submit(lambda: self.changed.emit("start", self._guard("starting the servers",
                                                                     lambda: self.host.ensure(chosen))))

    @Slot(str)
    def restart(self, name: str) -> None:
        """Stop the server and start it again; ``changed("restart NAME", ...)`` once it is ready or failed."""
        self._submit(lambda: self.changed.emit(f"restart {name}", self._guard(f"restarting {name}",
                                                                               lambda: self.host.restart(name))))

    @Slot(str, object)
    def prepare(self, conversation: str, names: list | None = None) -> None:
        """For a chat about to run a turn: start what it needs, then ``tools_ready`` with the enabled tools of
        the servers that are ready (an empty list when none could start: the chat goes on without tools)."""
        chosen = None if names is None else list(names)

        def job() -> None:
            specs: list = []
            self._quietly("listing the tools", lambda: specs.extend(self.host.tools(chosen)))
            self.tools_ready.emit(conversation, specs)

        self._submit(job)

    @Slot(str, object, float, object)
    def call(self, conversation: str, call: ToolCall, timeout_s: float, cancel: CancelToken) -> None:
        """Run one call the model made and store its result in the conversation (``run_call``: marked running
        first, then the result appended as a "tool" message); ``call_finished`` with its outcome, whatever
        happened (Stop included). When the result could not be stored the outcome says why (an error)."""

        def job() -> None:
            outcome: list = []
            problem = self._guard(f"running {call.name}", lambda: outcome.append(
                run_call(self.host, self.store, conversation, call, cancel, timeout_s)))
            self.call_finished.emit(conversation, call.id, outcome[0] if outcome else ToolOutcome(problem, True))

        self._submit(job)

    def _quietly(self, what: str, call: Callable[[], object]) -> None:
        """A host operation whose failures are states (FAILED with its error), not messages; a bug is logged."""
        problem = self._guard(what, call)
        if problem:
            self.changed.emit(what, problem)

    # the end ---------------------------------------------------------------------------------------------
    @Slot()
    def quiet(self) -> None:
        """Before the thread ends: stop looking at the host's states (on this thread, where the timer lives) and
        hand this object to the app's main thread, where ``close`` runs and a late call is still answered."""
        self._closed = True
        if self._timer is not None:
            self._timer.stop()
        self.moveToThread(QCoreApplication.instance().thread())

    def close(self) -> None:
        """Stop every server and the pool; idempotent. Called once the worker's thread has stopped."""
        self._closed = True
        if self._host is not None:
            try:
                self._host.close()
            except Exception:  # closing must not stop the app from quitting
                log.error("closing the tool servers failed:\n%s", traceback.format_exc())
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            _done, running = wait(list(self._futures), timeout=CLOSE_WAIT_S)  # stopped servers end their calls
            if running:
                log.warning("%d tool jobs did not end as the app quit", len(running))
                return  # they still use the store: it closes with the process
        if self._store is not None:
            self._store.close()


class ToolWorkerHost(QObject):
    """Owns the tool worker's thread and the queued signals that call it, the Stop tokens of calls in
    flight, and what the worker last said (the configured servers and their states, for dialogs that open
    later)."""

    request_refresh = Signal()
    request_ensure = Signal(object)  # list[str] | None (every enabled server)
    request_restart = Signal(str)
    request_add_stdio = Signal(str, str, object, object, str, bool)  # name, command, args, env, folder, replace
    request_add_http = Signal(str, str, object, bool)  # name, URL, headers dict, replace (an edit)
    request_import = Signal(str)  # an mcp.json's path
    request_remove = Signal(str)
    request_set_enabled = Signal(str, bool)
    request_set_tool_enabled = Signal(str, str, bool)  # server, tool, on
    request_prepare = Signal(str, object)  # conversation, list[str] | None
    request_call = Signal(str, object, float, object)  # conversation, ToolCall, timeout in seconds, CancelToken
    request_quiet = Signal()

    def __init__(self, paths: HearthPaths, parent: QObject | None = None):
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("hearth-tools")
        self.worker = ToolWorker(paths)
        self.worker.moveToThread(self.thread)
        w = self.worker
        for request, slot in ((self.request_refresh, w.refresh), (self.request_ensure, w.ensure),
                              (self.request_restart, w.restart), (self.request_add_stdio, w.add_stdio),
                              (self.request_add_http, w.add_http), (self.request_import, w.import_file),
                              (self.request_remove, w.remove), (self.request_set_enabled, w.set_enabled),
                              (self.request_set_tool_enabled, w.set_tool_enabled),
                              (self.request_prepare, w.prepare), (self.request_call, w.call)):
            request.connect(slot)
        self.request_quiet.connect(w.quiet, Qt.ConnectionType.BlockingQueuedConnection)
        self.configs: list = []  # list[ToolServerConfig], as last listed
        self.statuses: list = []  # list[ServerStatus], as last reported
        w.servers_listed.connect(self._on_listed)
        w.status_changed.connect(self._on_status)
        w.call_finished.connect(self._on_call_finished)
        self._cancels: dict[tuple[str, str], CancelToken] = {}
        self._stopped = False
        self.thread.start()
        self.request_refresh.emit()  # the configured servers, for Chat settings (tools.json is read; nothing starts)

    def _on_listed(self, configs: list) -> None:
        self.configs = list(configs)

    def _on_status(self, statuses: list) -> None:
        self.statuses = list(statuses)

    def call(self, conversation: str, call: ToolCall, timeout_s: float) -> CancelToken:
        """Run ``call`` for ``conversation`` (``worker.call_finished`` tells its outcome); Stop is ``cancel``."""
        token = CancelToken()
        if self._stopped:  # the app is closing: nothing runs now, and the chat still hears of the call
            token.interrupt()
            self.worker.call_finished.emit(conversation, call.id, ToolOutcome(CLOSING, is_error=True))
            return token
        self._cancels[(conversation, call.id)] = token
        self.request_call.emit(conversation, call, float(timeout_s), token)
        return token

    def cancel(self, conversation: str, call_id: str | None = None) -> None:
        """Stop the conversation's call ``call_id`` (None: all of its calls in flight)."""
        for key in [k for k in self._cancels if k[0] == conversation and call_id in (None, k[1])]:
            self._cancels.pop(key).cancel()

    def running(self, conversation: str) -> bool:
        return any(k[0] == conversation for k in self._cancels)

    def _on_call_finished(self, conversation: str, call_id: str, _outcome: ToolOutcome) -> None:
        self._cancels.pop((conversation, call_id), None)

    def stop(self, timeout_ms: int = 10000) -> bool:
        """Stop every call and server with the app; idempotent."""
        if self._stopped:
            return True
        self._stopped = True
        for token in self._cancels.values():
            token.interrupt()
        self._cancels.clear()
        if self.thread.isRunning():
            self.request_quiet.emit()  # blocking: a timer is stopped on its own thread
        self.thread.quit()
        stopped = self.thread.wait(timeout_ms)
        self.worker.close()  # the thread is gone: the servers are stopped from here, as the app quits
        return stopped
