"""A small MCP server for the tests (issue 33) whose tool answers with 10 MB of text (one block)."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

SIZE = 10 * 1024 * 1024
mcp = MCPServer("huge")


@mcp.tool(structured_output=False)
def huge(size: int = SIZE) -> str:
    """size characters of digits."""
    return ("0123456789" * (size // 10 + 1))[:size]


if __name__ == "__main__":
    mcp.run()
