"""The server's defences, as ASGI middleware that answers before the app sees a request:
the Host header (DNS rebinding), the Origin header and the body's declared type (cross-site requests
from web pages), the API key, and the body size (before any parsing)."""

from __future__ import annotations

import hmac
import ipaddress
import json

from engine.server.errors import shaped

WILDCARD_HOSTS = {"0.0.0.0", "::", ""}  # noqa: S104 — named to recognise them, not to bind
OPEN_PATHS = {"/health"}  # answered without a key: it says only whether the server is up
BODY_METHODS = {"POST", "PUT", "PATCH"}


async def _refuse(scope, send, status: int, message: str, code: str, headers: dict[str, str] | None = None) -> None:
    """The refusal in the shape of the API the path belongs to (OpenAI's, or Anthropic's on /v1/messages*)."""
    status, shape = shaped(scope.get("path", ""), status, message, None, code)
    body = json.dumps(shape).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return None


def host_name(host_header: str) -> str:
    """``example.com:8080`` → ``example.com``; ``[::1]:8080`` → ``::1``."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


class HostGuard:
    """A page on another site must not reach this server by pointing its own DNS name at 127.0.0.1
    (DNS rebinding): the Host header must name the bound address, ``localhost`` or an allowed host.
    Bound to every interface, any IP address is fine too (rebinding needs a name)."""

    def __init__(self, app, bound_host: str, allowed_hosts: tuple[str, ...] = ()):
        self.app = app
        self.wildcard = bound_host in WILDCARD_HOSTS
        self.allowed = {host_name(bound_host), "localhost", *(h.lower() for h in allowed_hosts)}

    def permits(self, host: str | None) -> bool:
        if not host:
            return False
        name = host_name(host)
        return name in self.allowed or (self.wildcard and _is_ip(name))

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not self.permits(_header(scope, b"host")):
            await _refuse(scope, send, 421, "this server answers only to its own address (the Host header named another; "
                                     "start it with --allow-host NAME to add one)", "host_not_allowed")
            return
        await self.app(scope, receive, send)


class OriginGuard:
    """A web page must not drive the server (cross-site request forgery): a browser sends ``Origin`` with
    every cross-site request, so one whose origin is not listed (``--cors-origin``) is refused, whatever
    the method. With none listed every page is refused, including a same-origin one: this server serves
    no pages, so a page on its own address can only be an old one left open from another program that
    once listened on this port. Clients that are not browsers send no ``Origin`` and pass.

    ``embedded``: the window's server, whose switch lists no origins: the refusal says it accepts no pages
    rather than pointing at a ``serve`` option the person cannot give it."""

    def __init__(self, app, allowed_origins: tuple[str, ...] = (), embedded: bool = False):
        self.app = app
        self.allowed = {o.rstrip("/").lower() for o in allowed_origins}
        self.hint = origin_hint(bool(self.allowed), embedded)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            origin = _header(scope, b"origin")
            if origin is not None and origin.strip().rstrip("/").lower() not in self.allowed:
                await _refuse(scope, send, 403, f"requests from web pages are refused (Origin: {origin[:100]!r}); {self.hint}",
                              "origin_not_allowed")
                return
        await self.app(scope, receive, send)


def origin_hint(listed: bool, embedded: bool) -> str:
    """What a refused page's developer can do, where the server runs."""
    if listed:
        return "it is not one of the allowed origins" if embedded else "it is not one of the --cors-origin origins"
    if embedded:
        return ("the window's local server accepts no web pages; for a page to call Hearth, run "
                "'hearth-cli serve --cors-origin ORIGIN' instead")
    return "start it with --cors-origin ORIGIN to let a page call it"


class JsonOnly:
    """A body must be declared ``application/json``: a page's form or a ``text/plain`` fetch (a "simple"
    request, which a browser sends without asking first) then never reaches the app, with or without
    an Origin header."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] in BODY_METHODS:
            declared = _header(scope, b"content-type") or ""
            if declared.split(";", 1)[0].strip().lower() != "application/json":
                got = f"Content-Type: {declared[:100]!r}" if declared else "no Content-Type"
                await _refuse(scope, send, 415, f"the body must be sent as 'Content-Type: application/json' (got {got})",
                              "unsupported_media_type")
                return
        await self.app(scope, receive, send)


def given_keys(scope) -> tuple[bool, list[str]]:
    """(whether the client sent any credentials, the keys it sent): ``x-api-key: KEY`` (Anthropic's clients)
    and ``Authorization: Bearer KEY`` (OpenAI's), on every endpoint; a client may send both."""
    keys, sent = [], False
    api_key = _header(scope, b"x-api-key")
    if api_key is not None:
        sent = True
        keys.append(api_key.strip())
    given = _header(scope, b"authorization")
    if given is not None:
        sent = True
        scheme, _, token = given.partition(" ")
        if scheme.lower() == "bearer":
            keys.append(token.strip())
    return sent, keys


class KeyGuard:
    """The API key, from ``x-api-key`` or ``Authorization: Bearer``, compared in constant time."""

    def __init__(self, app, api_key: str | None):
        self.app = app
        self.key = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.key is not None and scope["method"] != "OPTIONS" \
                and scope["path"] not in OPEN_PATHS:
            sent, keys = given_keys(scope)
            # every key compared (no early exit), each in constant time
            if not sum(hmac.compare_digest(k.encode(), self.key) for k in keys):
                message = ("missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'" if not sent
                           else "incorrect API key")
                await _refuse(scope, send, 401, message, "invalid_api_key", {"WWW-Authenticate": "Bearer"})
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """Reads the body up to ``limit`` bytes before the app parses anything: 413 past it, whether the
    client declared its length or streams it chunked."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and (not declared.strip().isdigit() or int(declared) > self.limit):
            await self._too_large(scope, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.limit:
                await self._too_large(scope, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # afterwards: the client's disconnect, when it comes

        await self.app(scope, replay, send)

    async def _too_large(self, scope, send) -> None:
        await _refuse(scope, send, 413, f"the request body is larger than this server accepts ({self.limit:,} bytes; "
                                 "see --max-body-bytes)", "request_too_large", {"Connection": "close"})
