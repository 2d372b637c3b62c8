"""A small real MCP server (the official SDK's MCPServer, over stdio) for tests/test_cli_tools.py: tools
``echo`` and ``shout``; with ``CLI_TOOL_SERVER_CRASH=1`` in its environment it prints its TOKEN to stderr and
exits before speaking MCP, as a server that dies at start (and leaks its secret) does."""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("cli-test")


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return text


@server.tool()
def shout(text: str) -> str:
    """Say the text back in capitals."""
    return text.upper()


if __name__ == "__main__":
    if os.environ.get("CLI_TOOL_SERVER_CRASH") == "1":
        sys.stderr.write(f"starting with token {os.environ.get('TOKEN', '')}\nfatal: cannot start\n")
        sys.exit(3)
    server.run()
