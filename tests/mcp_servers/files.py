"""A small MCP server for the tests (issue 33): reads and lists files inside one folder, and refuses any path
outside it. The folder is the first argument, else $FILES_ROOT."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("FILES_ROOT", "")).resolve()
mcp = MCPServer("files")


def _inside(path: str) -> Path:
    target = (ROOT / path).resolve()
    if target != ROOT and ROOT not in target.parents:
        raise ToolError(f"{path!r} is outside the folder this server may read")
    return target


@mcp.tool()
def read_file(path: str) -> str:
    """The text of a file inside the folder."""
    target = _inside(path)
    if not target.is_file():
        raise ToolError(f"{path!r} is not a file")
    return target.read_text(encoding="utf-8")


@mcp.tool()
def list_files(path: str = ".") -> str:
    """The names in a folder inside the folder, one a line (folders end with '/')."""
    target = _inside(path)
    if not target.is_dir():
        raise ToolError(f"{path!r} is not a folder")
    return "\n".join(sorted(p.name + ("/" if p.is_dir() else "") for p in target.iterdir()))


if __name__ == "__main__":
    if not ROOT.is_dir():
        sys.exit(f"files: {ROOT} is not a folder")
    mcp.run()
