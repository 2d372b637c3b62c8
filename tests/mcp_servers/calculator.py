"""A small MCP server for the tests (issue 33): arithmetic, an image, its own process id.

Over stdio by default; ``--http PORT`` serves streamable HTTP on 127.0.0.1 instead, and with ``--token-env NAME``
it refuses a request whose ``Authorization`` header is not ``Bearer <the value of $NAME>`` (a server that needs
a secret header)."""

from __future__ import annotations

import argparse
import os
import struct
import zlib

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image

mcp = MCPServer("calculator")


@mcp.tool()
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@mcp.tool()
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


@mcp.tool()
def divide(a: float, b: float) -> float:
    """Divide a by b."""
    if b == 0:
        raise ToolError("cannot divide by zero")
    return a / b


def _png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x80\x00" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


@mcp.tool()
def image(size: int = 8) -> Image:
    """An orange square, size x size pixels, as PNG."""
    return Image(data=_png(size, size), format="png")


@mcp.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


def _serve_http(port: int, token_env: str | None) -> None:
    import uvicorn

    app = mcp.streamable_http_app()
    token = os.environ.get(token_env, "") if token_env else ""

    async def guarded(scope, receive, send):
        if scope["type"] == "http" and token:
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization", b"").decode("latin-1") != f"Bearer {token}":
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"a valid bearer token is required"})
                return
        await app(scope, receive, send)

    uvicorn.run(guarded, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, metavar="PORT")
    parser.add_argument("--token-env")
    options = parser.parse_args()
    if options.http:
        _serve_http(options.http, options.token_env)
    else:
        mcp.run()
