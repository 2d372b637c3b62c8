"""One remote server over HTTP: its model list, and a streamed request with the bounded retry, the timeouts
and the plain-words errors the remote backend promises (docs/remote.md, "What you see").

A refusal is said in words naming the server (``server lab refused the API key``), never the key: the key
is only in the Authorization header, and any text a server sends back has it blotted out before it is
quoted, in case the server echoes it.
"""

from __future__ import annotations

import email.utils
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx

from engine.backends import remote_wire as wire
from engine.errors import PromptError
from engine.remotes import RemoteError, RemoteServer
from engine.types import CancelToken

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0  # a server on the LAN or the internet answers a connect in well under this
DEFAULT_READ_TIMEOUT_S = 120.0  # per chunk: a long prompt's prefill on a busy server sends nothing for a while
MAX_RETRY_WAIT_S = 10.0  # a 429/503's Retry-After is honoured once, up to this
DEFAULT_RETRY_WAIT_S = 1.0  # when it gives none
CANCEL_POLL_S = 0.05


class RemoteBusyError(RemoteError):
    """The server said 429 or 503 twice (once retried after its Retry-After)."""


class RemoteKeyError(RemoteError):
    """The server refused the key (401/403)."""


class RemoteModelError(RemoteError):
    """The server has no such model (404, or not in /v1/models)."""


class RemoteStoppedError(RemoteError):
    """The connection dropped, or the server stopped, in the middle of a reply."""


class ServerClient:
    """HTTP to one server: used from one thread; ``close`` lets go of its connections."""

    def __init__(self, server: RemoteServer, api_key: str | None, timeout_s: float = DEFAULT_READ_TIMEOUT_S):
        self.server = server
        self._key = api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        timeout = httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))
        # trust_env off: a proxy from the environment would see the key; a remote is reached directly
        self._http = httpx.Client(base_url=server.base_url, timeout=timeout, headers=headers, trust_env=False)
        self.timeout_s = timeout_s

    @property
    def name(self) -> str:
        return self.server.name

    def close(self) -> None:
        self._http.close()

    def scrub(self, text: str) -> str:
        """``text`` with the key blotted out (a server that echoes the Authorization header back)."""
        return text.replace(self._key, "[key]") if self._key else text

    # the model list ------------------------------------------------------------------------------------
    def models(self) -> list[wire.ListedModel]:
        with self._request("GET", "/v1/models", None, None) as response:
            body = _read_bounded(response, self.name)
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):
            raise RemoteError(self.scrub(f"server {self.name} did not answer /v1/models with JSON: "
                                         f"{wire.body_message(200, '', body)}")) from None
        return wire.listed_models(value, self.name)

    # a streamed request -------------------------------------------------------------------------------
    @contextmanager
    def stream(self, path: str, body: dict, cancel: CancelToken | None) -> Iterator[Iterator[dict]]:
        """The request's events (JSON chunks); a Stop (``cancel``) closes the connection even while the
        server is silent, and the events then just end. A whole JSON answer (a server that ignores
        ``stream``) comes as one event."""
        with self._request("POST", path, body, cancel) as response:
            kind = response.headers.get("content-type", "")
            if "json" in kind and "event-stream" not in kind:
                body_bytes = _read_bounded(response, self.name)
                yield iter([wire.json_object(body_bytes.decode("utf-8", errors="replace"), self.name)])
                return
            if "event-stream" not in kind:
                raise RemoteError(f"server {self.name} did not answer with a stream (content type "
                                  f"{kind[:60] or 'none'}): {self._refusal_text(response)}")
            yield self._events(response, cancel)

    def _events(self, response: httpx.Response, cancel: CancelToken | None) -> Iterator[dict]:
        try:
            for event in wire.events(wire.lines(response.iter_raw(), self.name), self.name):
                if cancel is not None and cancel.cancelled:
                    return
                yield event
        except httpx.HTTPError as exc:
            if cancel is not None and cancel.cancelled:  # the watcher shut the socket: a Stop, not a failure
                return
            raise RemoteStoppedError(self.scrub(f"the connection to server {self.name} broke mid-reply "
                                                f"({_why(exc, self.timeout_s)})")) from None

    @contextmanager
    def _request(self, method: str, path: str, body: dict | None,
                 cancel: CancelToken | None) -> Iterator[httpx.Response]:
        """The response once it says 200: one retry after a 429/503 (its Retry-After, at most
        MAX_RETRY_WAIT_S), then RemoteBusyError; other refusals as their errors."""
        for attempt in (1, 2):
            with self._watched(cancel) as watch:
                try:
                    request = self._http.build_request(method, path, json=body)
                    response = self._http.send(request, stream=True)
                except httpx.HTTPError as exc:
                    if cancel is not None and cancel.cancelled:
                        raise RemoteStoppedError(f"stopped before server {self.name} answered") from None
                    raise self._unreachable(exc) from None
                try:
                    if response.status_code in (429, 503) and attempt == 1:
                        wait = retry_after(response.headers.get("retry-after"))
                        log.info("server %s said %s; retrying once in %.1f s", self.name, response.status_code, wait)
                        response.read()
                        response.close()
                        if _sleep(wait, cancel):
                            raise RemoteStoppedError(f"stopped while waiting for server {self.name}")
                        continue
                    if response.status_code != 200:
                        raise self._refused(response, body)
                    watch(response)
                    yield response
                    return
                finally:
                    response.close()
        raise AssertionError("unreachable")

    @contextmanager
    def _watched(self, cancel: CancelToken | None) -> Iterator[Callable[[httpx.Response], None]]:
        """A thread that shuts the response's socket when ``cancel`` is set: a blocked read then returns at
        once, rather than when the server next sends something."""
        if cancel is None:
            yield lambda _response: None
            return
        done = threading.Event()
        current: list[httpx.Response] = []

        def watch() -> None:
            while not done.wait(CANCEL_POLL_S):
                if cancel.cancelled:
                    for response in current:
                        _shut(response)
                    return

        thread = threading.Thread(target=watch, name=f"remote-cancel-{self.name}", daemon=True)
        thread.start()
        try:
            yield current.append
        finally:
            done.set()
            thread.join(1)

    # errors -------------------------------------------------------------------------------------------
    def _unreachable(self, exc: httpx.HTTPError) -> RemoteError:
        where = self.server.base_url
        if isinstance(exc, httpx.ConnectTimeout):
            return RemoteError(f"server {self.name} ({where}) did not answer within {CONNECT_TIMEOUT_S:g} s")
        if isinstance(exc, httpx.TimeoutException):
            return RemoteError(f"server {self.name} ({where}) sent nothing for {self.timeout_s:g} s")
        if isinstance(exc, httpx.RemoteProtocolError):
            return RemoteStoppedError(f"server {self.name} ({where}) closed the connection before answering")
        return RemoteError(self.scrub(f"server {self.name} cannot be reached at {where} ({_why(exc, self.timeout_s)})"))

    def _refusal_text(self, response: httpx.Response) -> str:
        try:
            body = _read_bounded(response, self.name)
        except RemoteError:
            body = b""
        return self.scrub(wire.body_message(response.status_code, response.headers.get("content-type", ""), body))

    def _refused(self, response: httpx.Response, body: dict | None) -> RemoteError | PromptError:
        status, said = response.status_code, self._refusal_text(response)
        model = (body or {}).get("model")
        if status in (401, 403):
            return RemoteKeyError(f"server {self.name} refused the API key ({status}: {said}); give it the right one "
                                  f"with hearth-cli remote add {self.name} {self.server.base_url} --api-key-file FILE "
                                  "--replace")
        if status == 404:
            what = f"has no model {model!r}" if model else "has no such endpoint"
            return RemoteModelError(f"server {self.name} {what} ({status}: {said})")
        if status in (429, 503):
            wait = response.headers.get("retry-after")
            later = f"; it asks to wait {wait} s" if wait and len(wait) < 40 else ""
            return RemoteBusyError(f"server {self.name} is busy ({status}: {said}){later}; try again shortly")
        if status in (400, 413, 422):
            return PromptError(f"server {self.name} refused the request ({status}): {said}")
        return RemoteError(f"server {self.name} failed ({status}): {said}")


def retry_after(value: str | None) -> float:
    """Seconds to wait by a Retry-After header (seconds or an HTTP date), within 0..MAX_RETRY_WAIT_S."""
    if not value:
        return DEFAULT_RETRY_WAIT_S
    try:
        seconds = float(value.strip())
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return DEFAULT_RETRY_WAIT_S
        if when is None:
            return DEFAULT_RETRY_WAIT_S
        seconds = when.timestamp() - time.time()
    if seconds != seconds:  # NaN
        return DEFAULT_RETRY_WAIT_S
    return max(0.0, min(MAX_RETRY_WAIT_S, seconds))


def _sleep(seconds: float, cancel: CancelToken | None) -> bool:
    """Wait ``seconds``; True when ``cancel`` was set meanwhile."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if cancel is not None and cancel.cancelled:
            return True
        time.sleep(min(left, CANCEL_POLL_S))
    return cancel is not None and cancel.cancelled


def _read_bounded(response: httpx.Response, server: str) -> bytes:
    out = bytearray()
    for chunk in response.iter_raw():
        out += chunk
        if len(out) > wire.MAX_BODY_BYTES:
            raise RemoteError(f"server {server} sent an answer larger than {wire.MAX_BODY_BYTES >> 20} MiB")
    return bytes(out)


def _shut(response: httpx.Response) -> None:
    """Shut the response's socket down: a read blocked on it returns at once (closing it would not wake it)."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if isinstance(sock, socket.socket):
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _why(exc: httpx.HTTPError, timeout_s: float) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"nothing came for {timeout_s:g} s"
    text = str(exc) or type(exc).__name__
    return text.split("] ", 1)[-1] if text.startswith("[Errno") else text
