"""A small MCP server for the tests (issue 33) that dies: ``crash`` ends the process in the middle of a call.
At start it writes its $CRASH_TOKEN to stderr (a careless server: the host must blot it out), and when the
file named by $CRASH_REFUSE exists it exits at once instead (a restart that fails)."""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer

mcp = MCPServer("crash")


@mcp.tool()
def ping() -> str:
    """Answers pong."""
    return "pong"


@mcp.tool()
def crash() -> str:
    """Ends this server's process before it answers."""
    print("crash: about to fall over", file=sys.stderr, flush=True)
    os._exit(1)


@mcp.tool()
def pid() -> int:
    """This server's process id."""
    return os.getpid()


if __name__ == "__main__":
    print(f"crash: starting with token {os.environ.get('CRASH_TOKEN', '')}", file=sys.stderr, flush=True)
    refuse = os.environ.get("CRASH_REFUSE")
    if refuse and os.path.exists(refuse):
        print("crash: refusing to start", file=sys.stderr, flush=True)
        sys.exit(3)
    mcp.run()
