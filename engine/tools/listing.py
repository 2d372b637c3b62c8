"""A server's tools as the host offers them: every tools/list answer screened before the SDK validates it (the
SDK refuses a whole listing for one bad tool), the pages of a listing followed within bounds, and each tool's
function name, unique across the servers."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import anyio
import mcp_types as types
from mcp import Client
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from engine.tools.config import ToolServerConfig
from engine.tools.specs import (
    MAX_DESCRIPTION_CHARS,
    MAX_LIST_PAGES,
    MAX_TOOL_JSON_CHARS,
    MAX_TOOL_NAME_CHARS,
    MAX_TOOLS_EXAMINED,
    MAX_TOOLS_PER_SERVER,
    ToolSpec,
    sanitize_function,
    unique_function,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Listed:
    """A tool as its server listed it, checked and bounded."""

    name: str
    description: str
    parameters: dict


async def list_tools(client: Client) -> tuple[Listed, ...]:
    """The server's tools, every page (the screen has left out those that cannot be offered)."""
    listed: list[Listed] = []
    cursor: str | None = None
    for _page in range(MAX_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        listed += [Listed(tool.name, tool.description or "", tool.input_schema) for tool in page.tools]
        cursor = page.next_cursor
        if not cursor or len(listed) >= MAX_TOOLS_PER_SERVER:
            break
    return tuple(listed[:MAX_TOOLS_PER_SERVER])


def assign_functions(listings: Iterable[tuple[ToolServerConfig, Sequence[Listed]]]) -> dict[str, list[ToolSpec]]:
    """Every listed tool's function name, by server: its own (sanitised) unless another server lists the same,
    then prefixed with its server's name; unique and at most 64 characters either way."""
    listings = list(listings)
    entries = [(config, item) for config, listed in listings for item in listed]
    base = [sanitize_function(item.name) for _config, item in entries]
    owners: dict[str, set[str]] = {}
    for (config, _item), name in zip(entries, base, strict=True):
        owners.setdefault(name, set()).add(config.name)
    used: set[str] = set()
    specs: dict[str, list[ToolSpec]] = {config.name: [] for config, _listed in listings}
    for (config, item), name in zip(entries, base, strict=True):
        if len(owners[name]) > 1:
            name = sanitize_function(f"{config.name}_{item.name}")
        name = unique_function(name, used)
        used.add(name)
        specs[config.name].append(ToolSpec(
            server=config.name, name=item.name, function=name, description=item.description,
            parameters=item.parameters, enabled=config.tool_enabled(item.name)))
    return specs


class Screen:
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
        return None, f"it is not a valid MCP tool ({plain_validation(exc)})"
    return raw, ""


class _ScreenedRead:
    """The transport's read stream, with tools/list answers screened (``Screen``)."""

    def __init__(self, inner, screen: Screen) -> None:
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
    """The transport's write stream, noting which requests are tools/list (``Screen``)."""

    def __init__(self, inner, screen: Screen) -> None:
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


def plain_validation(exc: ValidationError) -> str:
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
