"""A small MCP server for the tests (issue 33) that hangs: ``hang`` never answers; ``freeze`` blocks the server's
event loop, so it answers nothing any more; with ``--at-start`` the
process never speaks MCP at all (a start that times out); with ``--linger`` it outlives the end of its stdin
(only a signal ends it: what a host that forgot its servers would leave behind)."""

from __future__ import annotations

import os
import sys
import time

import anyio
from mcp.server.mcpserver import MCPServer

mcp = MCPServer("hang")


@mcp.tool()
async def hang() -> str:
    """Never answers."""
    await anyio.sleep_forever()
    return "unreachable"


@mcp.tool()
async def freeze() -> str:
    """Blocks this server's event loop for an hour."""
    time.sleep(3600)
    return "unreachable"


@mcp.tool()
def ping() -> str:
    """Answers pong."""
    return "pong"


@mcp.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


if __name__ == "__main__":
    if "--at-start" in sys.argv:
        print("hang: sleeping instead of serving", file=sys.stderr, flush=True)
        while True:
            time.sleep(60)
    mcp.run()
    if "--linger" in sys.argv:
        while True:
            time.sleep(60)
