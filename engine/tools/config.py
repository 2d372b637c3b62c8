"""The MCP servers a person configured, kept in ``<data>/tools.json`` (atomic, private), their secrets (an
environment's values, an HTTP server's headers) in the secret store (engine/secret_store.py), never in the file.

A server is a name and either a program Hearth starts and talks to over its stdin/stdout ("stdio": a command,
its arguments, an environment, a working folder) or a streamable HTTP endpoint ("http": a URL and headers).
``import_servers`` reads the ``mcpServers`` JSON that Claude Desktop, Cursor, LM Studio (mcp.json), Windsurf
and Jan write, all or nothing. Everything read from a file is bounded and checked: a damaged ``tools.json``
is refused in words (as ``remotes.json`` is), never half-read.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from pathlib import Path
from urllib.parse import urlsplit

from engine.errors import HearthError
from engine.fsutil import atomic_write, open_regular
from engine.secret_store import SecretStore

log = logging.getLogger(__name__)

TOOLS_FILE = "tools.json"
FORMAT_VERSION = 1  # tools.json's "version"; a newer one is refused rather than misread
MAX_SERVERS = 32
SECRET_KIND = "tool-env"  # SecretStore kind; entries are named "<server>/<VARIABLE>" (headers "<server>/header:<Name>")
STDIO = "stdio"
HTTP = "http"
TRANSPORTS = (STDIO, HTTP)

MAX_FILE_BYTES = 1 << 20  # tools.json and an imported file
MAX_ARGS = 256
MAX_ARG_CHARS = 8192
MAX_COMMAND_CHARS = 4096
MAX_CWD_CHARS = 4096
MAX_ENV = 128
MAX_HEADERS = 64
MAX_VALUE_CHARS = 4096  # one environment or header value
MAX_SECRET_BYTES = 16 << 10  # a server's values together: 32 servers stay well inside the 1 MB secrets file
MAX_URL_CHARS = 2048
MAX_TOOL_NAME_CHARS = 128
MAX_DISABLED_TOOLS = 1024
REDACT_MIN_CHARS = 8  # shorter values ("1", "true") are too common in text to hide usefully

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
HEADER_NAME_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")  # RFC 9110's token
# headers the MCP transport itself sends: one set here would break the protocol, not configure the server
TRANSPORT_HEADERS = frozenset({"host", "content-length", "content-type", "transfer-encoding", "connection",
                               "accept", "mcp-session-id", "mcp-protocol-version"})
HTTP_TYPES = ("http", "streamable-http", "streamable_http", "streamablehttp")
IMPORT_KEYS = frozenset({"command", "args", "env", "cwd", "type", "transport", "url", "serverUrl", "headers",
                         "disabled", "active"})


class ToolConfigError(HearthError):
    """A server's configuration cannot be kept or read: a bad name, command, URL or file, in plain words."""


@dataclass(frozen=True)
class ToolServerConfig:
    """One configured MCP server. Secrets are never fields here: ``env_names``/``header_names`` name them,
    ``ToolRegistry.env_of``/``headers_of`` read their values."""

    name: str
    transport: str  # STDIO or HTTP
    command: str = ""  # stdio: the program
    args: tuple[str, ...] = ()
    env_names: tuple[str, ...] = ()  # stdio: the environment's variables (values in the secret store)
    cwd: str | None = None
    url: str = ""  # http: the streamable HTTP endpoint
    header_names: tuple[str, ...] = ()  # http: headers sent (values in the secret store)
    enabled: bool = True
    disabled_tools: frozenset[str] = field(default_factory=frozenset)  # the server's tools switched off

    def tool_enabled(self, tool: str) -> bool:
        return self.enabled and tool not in self.disabled_tools

    def secret_names(self) -> list[str]:
        """The secret store's names of this server's values."""
        return [env_secret(self.name, v) for v in self.env_names] + [header_secret(self.name, h)
                                                                      for h in self.header_names]


def env_secret(server: str, variable: str) -> str:
    return f"{server}/{variable}"


def header_secret(server: str, header: str) -> str:
    return f"{server}/header:{header}"


# checks: each returns the value as kept, or raises ToolConfigError saying what is wrong (never a secret) -----
def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        shown = repr(name)[:80] if isinstance(name, str) else "a non-text name"
        raise ToolConfigError(f"{shown} cannot name a tool server: use 1 to 64 letters, digits, '.', '_' or '-', "
                              "starting with a letter or digit")
    return name


def check_command(command: object) -> str:
    if not isinstance(command, str) or not command.strip():
        raise ToolConfigError("the command is empty: give the program that starts the server (e.g. npx, uvx, python)")
    if "\0" in command:
        raise ToolConfigError("the command holds a NUL character")
    if len(command) > MAX_COMMAND_CHARS:
        raise ToolConfigError(f"the command is longer than {MAX_COMMAND_CHARS} characters")
    return command


def check_args(args: object) -> tuple[str, ...]:
    if not isinstance(args, list | tuple):
        raise ToolConfigError("the arguments must be a list of text")
    if len(args) > MAX_ARGS:
        raise ToolConfigError(f"there are {len(args)} arguments: at most {MAX_ARGS}")
    for i, arg in enumerate(args, 1):
        if not isinstance(arg, str):
            raise ToolConfigError(f"argument {i} is not text (put it in quotes)")
        if "\0" in arg:
            raise ToolConfigError(f"argument {i} holds a NUL character")
        if len(arg) > MAX_ARG_CHARS:
            raise ToolConfigError(f"argument {i} is longer than {MAX_ARG_CHARS} characters")
    return tuple(args)


def check_cwd(cwd: object) -> str | None:
    if cwd is None or cwd == "":
        return None
    if not isinstance(cwd, str) or "\0" in cwd or len(cwd) > MAX_CWD_CHARS:
        raise ToolConfigError("the working folder must be a folder's path")
    path = os.path.expanduser(cwd)
    if not os.path.isabs(path):  # relative to what? Hearth's own folder changes with how it was started
        raise ToolConfigError(f"the working folder {cwd!r} is not an absolute path")
    return path


def _quoted(url: str) -> str:
    """The address as a refusal quotes it: not at all when it may hold a credential (a user name or password, a
    query or fragment), which the refusal would otherwise show (a dialog, a terminal, a log line)."""
    return "the address" if any(c in url for c in "@?#") else repr(url)


def check_url(url: object) -> str:
    """An HTTP server's endpoint: http(s), a host, no credentials, no query (tools.json is plain text: a key in
    the address would not stay secret; it belongs in a header)."""
    if not isinstance(url, str):
        raise ToolConfigError("the address must be text")
    url = url.strip()
    if len(url) > MAX_URL_CHARS:
        raise ToolConfigError(f"the address is longer than {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises for a port that is no number
    except ValueError:
        raise ToolConfigError(f"{_quoted(url)} is not a server address: its host or port cannot be read") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ToolConfigError(f"{_quoted(url)} is not a server address: write it as http://HOST:PORT/PATH "
                              "(or https://…)")
    if "@" in parts.netloc:
        raise ToolConfigError("the address holds a user name or password: send credentials as a header "
                              "(--header 'Authorization: Bearer …'), which Hearth keeps secret")
    if parts.query or parts.fragment:
        raise ToolConfigError("the address has a query or fragment (…?… or …#…): Hearth keeps addresses in plain "
                              "text, so send a key as a header (--header), which it keeps secret")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ToolConfigError("the address holds spaces or control characters")
    return url


def check_env(env: object) -> dict[str, str]:
    if not isinstance(env, Mapping):
        raise ToolConfigError("the environment must be an object of NAME: value")
    if len(env) > MAX_ENV:
        raise ToolConfigError(f"the environment has {len(env)} variables: at most {MAX_ENV}")
    seen: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME_RE.fullmatch(name):
            shown = repr(name)[:80] if isinstance(name, str) else "a non-text name"
            raise ToolConfigError(f"{shown} cannot name an environment variable: use letters, digits and '_' "
                                  "(up to 128), not starting with a digit")
        if name.upper() in seen:  # Windows and some keyrings tell no case apart
            raise ToolConfigError(f"the environment has {seen[name.upper()]} and {name}, differing only in case")
        seen[name.upper()] = name
        if not isinstance(value, str):
            raise ToolConfigError(f"the value of {name} is not text (put it in quotes)")
        if "\0" in value:
            raise ToolConfigError(f"the value of {name} holds a NUL character")
        if len(value) > MAX_VALUE_CHARS:
            raise ToolConfigError(f"the value of {name} is longer than {MAX_VALUE_CHARS} characters")
    return dict(env)


def check_headers(headers: object) -> dict[str, str]:
    if not isinstance(headers, Mapping):
        raise ToolConfigError("the headers must be an object of Name: value")
    if len(headers) > MAX_HEADERS:
        raise ToolConfigError(f"there are {len(headers)} headers: at most {MAX_HEADERS}")
    seen: dict[str, str] = {}
    kept: dict[str, str] = {}
    for name, value in headers.items():
        if not isinstance(name, str) or not HEADER_NAME_RE.fullmatch(name):
            shown = repr(name)[:80] if isinstance(name, str) else "a non-text name"
            raise ToolConfigError(f"{shown} cannot name an HTTP header: use letters, digits and '-' (up to 128)")
        if name.lower() in TRANSPORT_HEADERS:
            raise ToolConfigError(f"the header {name} is the MCP transport's own: Hearth sets it")
        if name.lower() in seen:
            raise ToolConfigError(f"the headers have {seen[name.lower()]} and {name}: a header is named once")
        seen[name.lower()] = name
        if not isinstance(value, str):
            raise ToolConfigError(f"the value of header {name} is not text")
        value = value.strip()
        if not value:
            raise ToolConfigError(f"the value of header {name} is empty")
        if len(value) > MAX_VALUE_CHARS:
            raise ToolConfigError(f"the value of header {name} is longer than {MAX_VALUE_CHARS} characters")
        if not all(" " <= c <= "~" for c in value):
            raise ToolConfigError(f"the value of header {name} holds line breaks, control or non-ASCII characters")
        kept[name] = value
    return kept


def check_tool_name(tool: object) -> str:
    if not isinstance(tool, str) or not tool or len(tool) > MAX_TOOL_NAME_CHARS or not tool.isprintable():
        raise ToolConfigError(f"a tool's name is 1 to {MAX_TOOL_NAME_CHARS} printable characters")
    return tool


def _check_secret_size(env: Mapping[str, str], headers: Mapping[str, str]) -> None:
    size = sum(len(json.dumps(v)) for v in (*env.values(), *headers.values()))
    if size > MAX_SECRET_BYTES:
        raise ToolConfigError(f"the environment and headers' values come to over {MAX_SECRET_BYTES >> 10} KiB: "
                              "keep large settings in a file the server reads")


@dataclass(frozen=True)
class _Entry:
    """A server to keep: its configuration and its secret values."""

    config: ToolServerConfig
    env: dict[str, str]
    headers: dict[str, str]

    def secrets(self) -> dict[str, str]:
        name = self.config.name
        return {**{env_secret(name, k): v for k, v in self.env.items()},
                **{header_secret(name, k): v for k, v in self.headers.items()}}


def _stdio_entry(name: str, command: object, args: object = (), env: object = None, cwd: object = None,
                 enabled: bool = True) -> _Entry:
    name = check_name(name)
    try:
        env_values = check_env({} if env is None else env)
        _check_secret_size(env_values, {})
        config = ToolServerConfig(name, STDIO, command=check_command(command), args=check_args(args),
                                  env_names=tuple(sorted(env_values)), cwd=check_cwd(cwd), enabled=enabled)
    except ToolConfigError as exc:
        raise ToolConfigError(f"server {name}: {exc}") from None
    return _Entry(config, env_values, {})


def _http_entry(name: str, url: object, headers: object = None, enabled: bool = True) -> _Entry:
    name = check_name(name)
    try:
        header_values = check_headers({} if headers is None else headers)
        _check_secret_size({}, header_values)
        config = ToolServerConfig(name, HTTP, url=check_url(url), header_names=tuple(sorted(header_values)),
                                  enabled=enabled)
    except ToolConfigError as exc:
        raise ToolConfigError(f"server {name}: {exc}") from None
    return _Entry(config, {}, header_values)


# tools.json ---------------------------------------------------------------------------------------------
def _to_json(config: ToolServerConfig) -> dict:
    entry: dict = {"transport": config.transport, "enabled": config.enabled,
                   "disabled_tools": sorted(config.disabled_tools)}
    if config.transport == STDIO:
        entry.update(command=config.command, args=list(config.args), env=list(config.env_names), cwd=config.cwd)
    else:
        entry.update(url=config.url, headers=list(config.header_names))
    return entry


def _from_json(name: str, entry: object) -> ToolServerConfig:
    """One stored server, checked as strictly as when it was added (ValueError or ToolConfigError if not)."""
    if not isinstance(entry, dict):
        raise ValueError("not an object")
    enabled, disabled = entry.get("enabled", True), entry.get("disabled_tools", [])
    if not isinstance(enabled, bool) or not isinstance(disabled, list) or len(disabled) > MAX_DISABLED_TOOLS:
        raise ValueError("bad switches")
    disabled_tools = frozenset(check_tool_name(t) for t in disabled)
    transport = entry.get("transport")
    if transport == STDIO:
        names = entry.get("env", [])
        if not isinstance(names, list) or len(set(map(str, names))) != len(names):
            raise ValueError("bad env")
        check_env(dict.fromkeys(names, ""))
        config = _stdio_entry(name, entry.get("command"), entry.get("args", []), None, entry.get("cwd")).config
        return dc_replace(config, env_names=tuple(sorted(names)), enabled=enabled, disabled_tools=disabled_tools)
    if transport == HTTP:
        names = entry.get("headers", [])
        if not isinstance(names, list) or len(set(map(str, names))) != len(names):
            raise ValueError("bad headers")
        check_headers(dict.fromkeys(names, "x"))
        config = _http_entry(name, entry.get("url")).config
        return dc_replace(config, header_names=tuple(sorted(names)), enabled=enabled, disabled_tools=disabled_tools)
    raise ValueError("unknown transport")


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    seen: dict = {}
    for key, value in pairs:
        if key in seen:  # json.loads would keep the last silently: a server (or variable) quietly lost
            raise ToolConfigError(f"the name {key[:80]!r} appears twice in one object")
        seen[key] = value
    return seen


def read_json_document(path: Path, what: str) -> object:
    """The JSON in ``path`` (a regular file of at most MAX_FILE_BYTES, no key twice in an object), or a
    ToolConfigError naming ``what`` and the problem."""
    try:
        with open_regular(Path(path)) as fh:  # a FIFO would hang the read
            data = fh.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ToolConfigError(f"{what} {path} is not there") from None
    except OSError as exc:
        raise ToolConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ToolConfigError(f"{what} {path} is larger than {MAX_FILE_BYTES >> 20} MiB")
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except UnicodeDecodeError:
        raise ToolConfigError(f"{what} {path} is not UTF-8 text") from None
    except RecursionError:
        raise ToolConfigError(f"{what} {path} nests lists or objects too deeply") from None
    except ToolConfigError as exc:
        raise ToolConfigError(f"{what} {path}: {exc}") from None
    except ValueError as exc:
        raise ToolConfigError(f"{what} {path} is not valid JSON: {exc}") from None


# the mcpServers format ----------------------------------------------------------------------------------
def _import_entry(name: object, spec: object, notes: list[str]) -> _Entry:
    """One ``mcpServers`` entry as Claude Desktop, Cursor, LM Studio, Windsurf, Cline or Jan write it."""
    name = check_name(name)  # type: ignore[arg-type]

    def refuse(why: str) -> ToolConfigError:
        return ToolConfigError(f"server {name}: {why}")

    if not isinstance(spec, dict):
        raise refuse("its entry is not an object")
    unknown = sorted(k for k in spec if k not in IMPORT_KEYS)
    if unknown:
        notes.append(f"server {name}: ignored {', '.join(repr(k[:40]) for k in unknown[:8])}"
                     + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "") + " (Hearth has no such setting)")
    enabled = True
    for key, on in (("disabled", False), ("active", True)):  # Cline/Cursor say "disabled", Jan "active"
        if key in spec:
            if not isinstance(spec[key], bool):
                raise refuse(f'"{key}" must be true or false')
            enabled = enabled and spec[key] == on
    kind = spec.get("type", spec.get("transport"))
    if kind is not None and not isinstance(kind, str):
        raise refuse('its "type" must be text')
    kind = None if kind is None else kind.strip().lower()
    urls = {spec[k] for k in ("url", "serverUrl") if k in spec}
    if len(urls) > 1:
        raise refuse('"url" and "serverUrl" differ: give one address')
    if kind == "sse":
        raise refuse('it uses the older SSE transport ("type": "sse"), which Hearth does not speak; if the server '
                     "offers streamable HTTP too (often at /mcp), give that address with \"type\": \"http\"")
    if kind is not None and kind != STDIO and kind not in HTTP_TYPES:
        raise refuse(f'its "type" {kind[:40]!r} is none of stdio, http, streamable-http')
    if kind is None:
        if "command" in spec:
            kind = STDIO
        elif urls:
            kind = HTTP
        else:
            raise refuse('it has neither a "command" (a program to start) nor a "url" (an HTTP server)')
    try:
        if kind == STDIO:
            stray = [k for k in ("url", "serverUrl", "headers") if k in spec]
            if stray:
                raise ToolConfigError(f'it starts a program, so "{stray[0]}" (an HTTP server\'s) does not fit it')
            if "command" not in spec:
                raise ToolConfigError('it has no "command"')
            return _stdio_entry(name, spec["command"], _given(spec, "args", []), _given(spec, "env", {}),
                                spec.get("cwd"), enabled)
        stray = [k for k in ("command", "args", "env", "cwd") if k in spec]
        if stray:
            raise ToolConfigError(f'it is an HTTP server, so "{stray[0]}" (a program\'s) does not fit it')
        if not urls:
            raise ToolConfigError('it has no "url"')
        return _http_entry(name, urls.pop(), _given(spec, "headers", {}), enabled)
    except ToolConfigError as exc:
        text = str(exc)
        raise ToolConfigError(text if text.startswith(f"server {name}: ") else f"server {name}: {text}") from None


def _given(spec: dict, key: str, empty: object) -> object:
    """``spec[key]``, with ``empty`` for a key left out or null (as the apps write an empty one)."""
    value = spec.get(key)
    return empty if value is None else value


def parse_import(document: object, notes: list[str] | None = None) -> list[_Entry]:
    """The servers of an ``{"mcpServers": {...}}`` document, every one checked; the first bad one refuses all."""
    notes = [] if notes is None else notes
    if not isinstance(document, dict) or not isinstance(document.get("mcpServers"), dict):
        raise ToolConfigError('it has no "mcpServers" object: Hearth reads the {"mcpServers": {"NAME": {...}}} '
                              "format of Claude Desktop, Cursor, LM Studio and Jan")
    servers = document["mcpServers"]
    if not servers:
        raise ToolConfigError('its "mcpServers" lists no servers')
    if len(servers) > MAX_SERVERS:
        raise ToolConfigError(f"it lists {len(servers)} servers: Hearth keeps at most {MAX_SERVERS}")
    entries = [_import_entry(name, spec, notes) for name, spec in servers.items()]
    _no_case_twins([e.config.name for e in entries], "the file has")
    return entries


def _no_case_twins(names: Iterable[str], where: str) -> None:
    seen: dict[str, str] = {}
    for name in names:
        if name.lower() in seen:  # some keyrings (Windows') tell no case apart: their secrets would mix
            raise ToolConfigError(f"{where} servers {seen[name.lower()]!r} and {name!r}, differing only in case")
        seen[name.lower()] = name


class ToolRegistry:
    """The configured servers (``<data>/tools.json``) and their secrets."""

    def __init__(self, data_dir: Path, secrets: SecretStore | None = None):
        self.path = Path(data_dir) / TOOLS_FILE
        self.secrets = secrets or SecretStore(Path(data_dir))

    def servers(self) -> list[ToolServerConfig]:
        return [config for _, config in sorted(self._read().items())]

    def get(self, name: str) -> ToolServerConfig:
        configs = self._read()
        if name not in configs:
            known = ", ".join(sorted(configs)) or "none yet"
            raise ToolConfigError(f"there is no tool server named {str(name)[:80]!r} (servers: {known}); add one "
                                  "with hearth-cli tools add or tools import")
        return configs[name]

    def env_of(self, name: str) -> dict[str, str]:
        """A stdio server's environment values (from the secret store)."""
        config = self.get(name)
        return {var: self._secret(config, env_secret(name, var), f"the value of {var}") for var in config.env_names}

    def headers_of(self, name: str) -> dict[str, str]:
        config = self.get(name)
        return {h: self._secret(config, header_secret(name, h), f"the header {h}") for h in config.header_names}

    def redact(self, text: str, names: Iterable[str] | None = None) -> str:
        """``text`` (a server's stderr, an error) with the secret values of the servers ``names`` (default: all)
        replaced by ``•••`` (the host's mark): a server that prints its token must not show it to the person's terminal,
        a --json output or a log. Values (and their words) shorter than REDACT_MIN_CHARS are left."""
        if not text:
            return text
        configs = self._read()
        pieces: set[str] = set()
        for name in configs if names is None else [n for n in names if n in configs]:
            for secret in configs[name].secret_names():
                value = self.secrets.get(SECRET_KIND, secret) or ""
                pieces.update(p for p in (value, *value.split()) if len(p) >= REDACT_MIN_CHARS)
        for piece in sorted(pieces, key=len, reverse=True):
            text = text.replace(piece, "•••")
        return text

    # changes --------------------------------------------------------------------------------------------
    def add_stdio(self, name: str, command: str, args: Iterable[str] = (), env: Mapping[str, str] | None = None,
                  cwd: str | None = None, *, replace: bool = False) -> ToolServerConfig:
        """Keep a server Hearth starts as ``command args`` with ``env`` (values to the secret store)."""
        entry = _stdio_entry(name, command, list(args), env or {}, cwd)
        self._keep([entry], replace)
        return entry.config

    def add_http(self, name: str, url: str, headers: Mapping[str, str] | None = None, *,
                 replace: bool = False) -> ToolServerConfig:
        """Keep a streamable HTTP server at ``url``, sent ``headers`` (values to the secret store)."""
        entry = _http_entry(name, url, headers or {})
        self._keep([entry], replace)
        return entry.config

    def import_servers(self, document: dict | str | os.PathLike, *, replace: bool = False,
                       notes: list[str] | None = None) -> list[str]:
        """Add every server of an ``mcpServers`` document (or the JSON file at that path), all or nothing; the
        names added. ``notes`` (when given) gets a line for each setting Hearth ignored."""
        if isinstance(document, str | os.PathLike):
            where = str(document)
            document = read_json_document(Path(document), "the file to import")
        else:
            where = "the document"
        found: list[str] = []
        try:
            entries = parse_import(document, found)
        except ToolConfigError as exc:
            raise ToolConfigError(f"nothing was imported from {where}: {exc}") from None
        try:
            self._keep(entries, replace)
        except ToolConfigError as exc:
            raise ToolConfigError(f"nothing was imported from {where}: {exc}") from None
        if notes is not None:
            notes.extend(found)
        for note in found:
            log.info("import of %s: %s", where, note)
        return [e.config.name for e in entries]

    def remove(self, name: str) -> None:
        """Forget a server and its secrets."""
        configs = self._read()
        config = configs.pop(name, None) or self.get(name)  # get: the plain "no such server" error
        self._write(configs)
        self.secrets.delete_many(SECRET_KIND, config.secret_names())

    def set_enabled(self, name: str, enabled: bool) -> ToolServerConfig:
        return self._change(name, lambda c: dc_replace(c, enabled=bool(enabled)))

    def set_tool_enabled(self, server: str, tool: str, enabled: bool) -> ToolServerConfig:
        """Switch one of a server's tools on or off (the server itself keeps its own switch)."""
        tool = check_tool_name(tool)

        def switch(config: ToolServerConfig) -> ToolServerConfig:
            off = config.disabled_tools - {tool} if enabled else config.disabled_tools | {tool}
            if len(off) > MAX_DISABLED_TOOLS:
                raise ToolConfigError(f"server {server} has {MAX_DISABLED_TOOLS} tools switched off already: "
                                      "disable the server instead")
            return dc_replace(config, disabled_tools=frozenset(off))

        return self._change(server, switch)

    def _change(self, name: str, how) -> ToolServerConfig:
        configs = self._read()
        if name not in configs:
            self.get(name)
        configs[name] = how(configs[name])
        self._write(configs)
        return configs[name]

    def _keep(self, entries: list[_Entry], replace: bool) -> None:
        """Add (or with ``replace``, put in place of those of the same names) ``entries``: their secrets first,
        then the file, then the replaced servers' secrets no longer named; a failure leaves the old list."""
        configs = self._read()
        old = {e.config.name: configs[e.config.name] for e in entries if e.config.name in configs}
        if old and not replace:
            names = ", ".join(sorted(old))
            raise ToolConfigError(f"a tool server named {names} exists already; replace it with --replace, remove "
                                  "it first, or choose another name")
        _no_case_twins([*configs, *(e.config.name for e in entries if e.config.name not in configs)],
                       "there would be")
        total = len(configs.keys() | {e.config.name for e in entries})
        if total > MAX_SERVERS:
            raise ToolConfigError(f"Hearth keeps at most {MAX_SERVERS} tool servers ({total} with these); "
                                  "remove some first")
        new_secrets = {k: v for e in entries for k, v in e.secrets().items()}
        self.secrets.set_many(SECRET_KIND, new_secrets)  # first: a refused secret leaves nothing half-added
        before = {s for c in old.values() for s in c.secret_names()}
        for entry in entries:
            configs[entry.config.name] = entry.config
        try:
            self._write(configs)
        except ToolConfigError:
            self.secrets.delete_many(SECRET_KIND, new_secrets.keys() - before)
            raise
        self.secrets.delete_many(SECRET_KIND, before - new_secrets.keys())

    def _secret(self, config: ToolServerConfig, secret: str, what: str) -> str:
        value = self.secrets.get(SECRET_KIND, secret)
        if value is None:
            raise ToolConfigError(f"{what} of tool server {config.name} is missing from {self.secrets.where}; "
                                  "add the server again (hearth-cli tools add --replace)")
        return value

    def _read(self) -> dict[str, ToolServerConfig]:
        try:
            with open(self.path, "rb") as fh:
                data = fh.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise ToolConfigError(f"cannot read the list of tool servers {self.path}: {exc.strerror or exc}") from None

        def damaged(why: str) -> ToolConfigError:
            return ToolConfigError(f"the list of tool servers {self.path} is damaged ({why}); move it away and add "
                                   "the servers again")

        if len(data) > MAX_FILE_BYTES:
            raise damaged(f"larger than {MAX_FILE_BYTES >> 20} MiB")
        try:
            document = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise damaged("not JSON") from None
        if not isinstance(document, dict) or not isinstance(document.get("servers"), dict):
            raise damaged("no servers object")
        version = document.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise damaged("no format version")
        if version > FORMAT_VERSION:
            raise ToolConfigError(f"the list of tool servers {self.path} was written by a newer Hearth (format "
                                  f"{version}); update Hearth to use it")
        servers = document["servers"]
        if len(servers) > MAX_SERVERS:
            raise damaged(f"more than {MAX_SERVERS} servers")
        configs: dict[str, ToolServerConfig] = {}
        for name, entry in servers.items():
            try:
                configs[name] = _from_json(name, entry)
            except (ToolConfigError, ValueError, TypeError):
                raise damaged(f"server {name[:64]!r} is not one Hearth wrote") from None
        try:
            _no_case_twins(configs, "it has")
        except ToolConfigError as exc:
            raise damaged(str(exc)) from None
        return configs

    def _write(self, configs: dict[str, ToolServerConfig]) -> None:
        document = {"version": FORMAT_VERSION, "servers": {n: _to_json(c) for n, c in sorted(configs.items())}}
        try:
            with atomic_write(self.path) as fh:  # mkstemp: 0600 whatever the umask
                fh.write(json.dumps(document, indent=1, ensure_ascii=False).encode("utf-8"))
        except OSError as exc:
            raise ToolConfigError(f"cannot save the list of tool servers {self.path}: {exc.strerror or exc}") from None
