"""A small MCP server for the window's tool-loop tests (issue 33): tools whose arguments are a closed set of words,
so a tiny random model forced to call one (constrained decoding) always writes a short, valid call."""

from __future__ import annotations

from typing import Literal

import anyio
from mcp.server.mcpserver import MCPServer

mcp = MCPServer("picker")


@mcp.tool()
def lookup(key: Literal["red", "green", "blue"]) -> str:
    """What a colour is."""
    return f"{key} is a colour of the rainbow"


@mcp.tool()
async def slow(key: Literal["x"]) -> str:
    """Never finishes: a call to stop."""
    await anyio.sleep(3600)
    return key


@mcp.tool(structured_output=False)
def flood() -> str:
    """10 MB of text: more than any result may give the model."""
    return "flood " * (10 * 1024 * 1024 // 6)


if __name__ == "__main__":
    mcp.run()
