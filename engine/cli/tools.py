"""``hearth-cli tools import | add | rm | enable | disable | ls``: the MCP servers whose tools a chat may use
(issue 33). Environment values and headers go to the secret store (the system keyring, else a private file);
no output, --json included, ever shows one: ``ls`` names the variables and headers, never their values.

``tools add NAME [options] -- COMMAND [ARGS...]``: argparse cannot take a command with options of its own
after ``--`` once the subcommand's options come before it (a ``*`` positional is consumed early, REMAINDER
swallows the options), so ``main`` splits the words after the first ``--`` off first (:func:`split_command`).
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from pathlib import Path

from engine.api import ToolConfigError, ToolHost, ToolRegistry, open_regular, terminal_safe
from engine.cli.common import data_paths, emit

log = logging.getLogger(__name__)

MAX_ENV_FILE_BYTES = 64 << 10
STDERR_LINES_SHOWN = 5  # a failed server's last stderr lines in ``ls``
ADD_USAGE = ("hearth-cli tools add NAME [--env KEY=VALUE ...] [--env-file FILE] [--cwd DIR] [--replace] "
             "-- COMMAND [ARGS ...]\n       hearth-cli tools add NAME --url URL [--header 'Name: value' ...] "
             "[--replace]")


def add_parser(sub, common: argparse.ArgumentParser) -> None:
    tools = sub.add_parser("tools", parents=[common],
                           help="MCP servers whose tools a chat may use: import, add, remove, switch, list")
    tsub = tools.add_subparsers(dest="tools_command", required=True, metavar="ACTION")
    imp = tsub.add_parser("import", parents=[common],
                          help='add the servers of an {"mcpServers": ...} file (Claude Desktop, Cursor, LM Studio '
                               "mcp.json, Jan); all or nothing")
    imp.add_argument("file", metavar="FILE.json")
    imp.add_argument("--replace", action="store_true", help="replace servers of the same names")
    imp.set_defaults(func=cmd_import)

    add = tsub.add_parser("add", parents=[common], usage=ADD_USAGE,
                          help="add a server Hearth starts (-- COMMAND ARGS) or an HTTP one (--url)")
    add.add_argument("name", metavar="NAME", help="1-64 letters, digits, . _ - (starting with a letter or digit)")
    add.add_argument("server_command", nargs="*", metavar="-- COMMAND [ARGS]",
                     help="the program that starts the server and its arguments, after --")
    add.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                     help="an environment variable for the server (repeatable; kept secret; a value given here is "
                          "in your shell's history: prefer --env-file)")
    add.add_argument("--env-file", type=Path, metavar="FILE", help="KEY=VALUE lines (# comments, blank lines)")
    add.add_argument("--cwd", metavar="DIR", help="the folder the server starts in")
    add.add_argument("--url", help="a streamable HTTP server's endpoint, e.g. https://host/mcp")
    add.add_argument("--header", action="append", default=[], metavar="'Name: value'",
                     help="an HTTP header to send (repeatable; kept secret)")
    add.add_argument("--replace", action="store_true", help="replace a server of that name (and its secrets)")
    add.set_defaults(func=cmd_add)

    rm = tsub.add_parser("rm", parents=[common], help="remove a server and its secrets")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(func=cmd_rm)
    for action, on in (("enable", True), ("disable", False)):
        switch = tsub.add_parser(action, parents=[common], help=f"{action} a server, or one of its tools (NAME/TOOL)")
        switch.add_argument("target", metavar="NAME[/TOOL]")
        switch.set_defaults(func=cmd_switch, enable=on)
    ls = tsub.add_parser("ls", parents=[common],
                         help="the servers, started to list their state and tools (--no-start: configuration only)")
    ls.add_argument("--no-start", action="store_true", help="list the configuration without starting any server")
    ls.set_defaults(func=cmd_ls)


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``(the words before the first "--", the words after it)`` when ``argv`` is ``tools add … -- COMMAND …``,
    else ``(argv, None)``: every other command parses ``--`` as argparse does."""
    if "--" not in argv:
        return argv, None
    cut = argv.index("--")
    words, i = [], 0
    while i < cut and len(words) < 2:  # the two words before it, past the common options (--data-dir takes one)
        word = argv[i]
        if word.startswith("--") and "=" not in word and len(word) > 3 and "--data-dir".startswith(word):
            i += 2
            continue
        if not word.startswith("-"):
            words.append(word)
        i += 1
    if words != ["tools", "add"]:
        return argv, None
    return argv[:cut], argv[cut + 1:]


# commands -----------------------------------------------------------------------------------------------
def cmd_import(args: argparse.Namespace) -> int:
    registry = ToolRegistry(data_paths(args).data)
    notes: list[str] = []
    names = registry.import_servers(Path(args.file), replace=args.replace, notes=notes)
    for note in notes:
        sys.stderr.write(terminal_safe(f"note: {note}") + "\n")
    secrets = any(c.env_names or c.header_names for c in registry.servers() if c.name in names)
    text = f"imported {len(names)} tool server(s): {', '.join(names)}"
    if secrets:
        text += f"; their environment values and headers are kept in {registry.secrets.where}"
    emit(args, {"imported": names, "notes": notes, "secrets_kept_in": registry.secrets.where if secrets else None},
         text + "\nsee their tools with hearth-cli tools ls")
    return 0


def cmd_add(args: argparse.Namespace) -> int:
    command = list(args.server_command or [])
    registry = ToolRegistry(data_paths(args).data)
    if args.url is not None:
        stray = next((flag for flag, given in (("command", command), ("--env", args.env), ("--env-file",
                      args.env_file), ("--cwd", args.cwd)) if given), None)
        if stray:
            raise ToolConfigError(f"an HTTP server (--url) takes no {stray}: give either --url or a command after --")
        config = registry.add_http(args.name, args.url, parse_headers(args.header), replace=args.replace)
    else:
        if args.header:
            raise ToolConfigError("--header is for an HTTP server (--url); a server started as a command gets --env")
        if not command:
            raise ToolConfigError("give the command that starts the server after --, e.g. hearth-cli tools add NAME "
                                  "-- npx -y @modelcontextprotocol/server-filesystem ~/notes (or --url for an HTTP "
                                  "server)")
        env = read_env_file(args.env_file) if args.env_file is not None else {}
        env.update(parse_env(args.env))  # --env after the file: a flag overrides the file's line
        config = registry.add_stdio(args.name, command[0], command[1:], env, check_dir(args.cwd),
                                    replace=args.replace)
    secrets = bool(config.env_names or config.header_names)
    where = registry.secrets.where if secrets else None
    text = f"added tool server {config.name} ({describe(config)})"
    if secrets:
        text += f"; {'its environment values' if config.env_names else 'its headers'} kept in {where}"
    emit(args, {**config_json(config), "secrets_kept_in": where}, text + "\nsee its tools with hearth-cli tools ls")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    ToolRegistry(data_paths(args).data).remove(args.name)
    emit(args, {"removed": args.name}, f"removed tool server {args.name} and its secrets")
    return 0


def cmd_switch(args: argparse.Namespace) -> int:
    registry = ToolRegistry(data_paths(args).data)
    server, slash, tool = args.target.partition("/")
    word = "enabled" if args.enable else "disabled"
    if not slash:
        registry.set_enabled(server, args.enable)
        emit(args, {"server": server, "tool": None, "enabled": args.enable}, f"{word} tool server {server}")
        return 0
    if not tool:
        raise ToolConfigError(f"{args.target!r} names no tool: write NAME/TOOL, or NAME for the whole server")
    config = registry.set_tool_enabled(server, tool, args.enable)
    text = f"{word} tool {tool} of server {server}"
    if args.enable and not config.enabled:
        text += f" (the server itself is disabled: hearth-cli tools enable {server})"
    emit(args, {"server": server, "tool": tool, "enabled": args.enable}, text)
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    registry = ToolRegistry(data_paths(args).data)
    configs = registry.servers()
    statuses = {}
    if not args.no_start and any(c.enabled for c in configs):
        host = ToolHost(registry)
        try:
            host.ensure()
            statuses = {s.name: s for s in host.status()}
        finally:
            host.close()
    servers = []
    for config in configs:
        status = statuses.get(config.name)
        entry = {**config_json(config), "state": None, "error": "", "stderr_tail": "", "tools": []}
        if status is not None:
            # a server may print its token; what it says passes through the redaction before anyone sees it
            entry.update(state=str(status.state), error=registry.redact(status.error, [config.name]),
                         stderr_tail=registry.redact(status.stderr_tail, [config.name]),
                         tools=[{"name": t.name, "function": t.function, "description": t.description,
                                 "enabled": t.enabled and config.tool_enabled(t.name)} for t in status.tools])
        servers.append(entry)
    emit(args, {"servers": servers}, ls_text(servers, started=bool(statuses)))
    return 0


# reading the flags ----------------------------------------------------------------------------------------
def _nth(i: int) -> str:
    """1st, 2nd, 3rd, 4th … 11th, 12th, 13th … 21st."""
    suffix = "th" if 10 <= i % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(i % 10, "th")
    return f"{i}{suffix}"


def parse_env(pairs: list[str]) -> dict[str, str]:
    """``--env KEY=VALUE`` flags; a malformed one is refused without echoing it (it may hold the secret)."""
    env: dict[str, str] = {}
    for i, pair in enumerate(pairs, 1):
        name, eq, value = pair.partition("=")
        if not eq or not name:
            raise ToolConfigError(f"the {_nth(i)} --env is not KEY=VALUE (write it as --env TOKEN=…)")
        if name in env:
            raise ToolConfigError(f"--env gives {name[:80]!r} twice")
        env[name] = value
    return env


def parse_headers(lines: list[str]) -> dict[str, str]:
    """``--header 'Name: value'`` flags, refused without echoing (the value is a secret)."""
    headers: dict[str, str] = {}
    for i, line in enumerate(lines, 1):
        name, colon, value = line.partition(":")
        name = name.strip()
        if not colon or not name:
            raise ToolConfigError(f"the {_nth(i)} --header is not 'Name: value' (write it as "
                                  "--header 'Authorization: Bearer …')")
        if name.lower() in (h.lower() for h in headers):
            raise ToolConfigError(f"--header gives {name[:80]!r} twice")
        headers[name] = value.strip()
    return headers


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (``export`` before one, blank lines and ``#`` comments allowed; a value in matching
    quotes loses them, as dotenv files are read). Errors name the line, never its value."""
    what = f"the environment file {path}"
    try:
        with open_regular(path) as fh:  # a FIFO would hang the read
            data = fh.read(MAX_ENV_FILE_BYTES + 1)
    except OSError as exc:
        raise ToolConfigError(f"cannot read {what}: {exc.strerror or exc}") from None
    if len(data) > MAX_ENV_FILE_BYTES:
        raise ToolConfigError(f"{what} is larger than {MAX_ENV_FILE_BYTES >> 10} KiB")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ToolConfigError(f"{what} is not UTF-8 text") from None
    env: dict[str, str] = {}
    line_of: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        name, eq, value = line.partition("=")
        name = name.strip()
        if not eq or not name:
            raise ToolConfigError(f"line {number} of {what} is not KEY=VALUE")
        if name in env:
            raise ToolConfigError(f"{what} gives {name[:80]!r} twice (lines {line_of[name]} and {number})")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[name], line_of[name] = value, number
    return env


def check_dir(cwd: str | None) -> str | None:
    """``--cwd`` as an absolute folder that is there (relative to where the command runs)."""
    if cwd is None:
        return None
    path = Path(cwd).expanduser().absolute()
    if not path.is_dir():
        raise ToolConfigError(f"--cwd {cwd} is not a folder")
    return os.path.normpath(path)


# output -----------------------------------------------------------------------------------------------------
def describe(config) -> str:
    if config.transport == "http":
        return f"http: {config.url}"
    return f"stdio: {shlex.join([config.command, *config.args])}"


def config_json(config) -> dict:
    """A server's configuration for --json: the variables' and headers' names, never their values."""
    return {"name": config.name, "transport": config.transport, "command": config.command or None,
            "args": list(config.args), "cwd": config.cwd, "url": config.url or None, "env": list(config.env_names),
            "headers": list(config.header_names), "enabled": config.enabled,
            "disabled_tools": sorted(config.disabled_tools)}


def ls_text(servers: list[dict], started: bool) -> str:
    if not servers:
        return ("0 tool servers; add one with hearth-cli tools add NAME -- COMMAND [ARGS] (or --url URL), or "
                "import a Claude Desktop / Cursor / LM Studio file with hearth-cli tools import FILE.json")
    width = max(4, *(len(s["name"]) for s in servers))
    lines = [f"{'NAME':<{width}}  ON   {'STATE':<8}  SERVER"]
    ready_tools = 0
    for s in servers:
        what = f"{s['url']}" if s["transport"] == "http" else shlex.join([s["command"], *s["args"]])
        names = s["headers"] if s["transport"] == "http" else s["env"]
        if names:
            what += f"  [{'headers' if s['transport'] == 'http' else 'env'}: {', '.join(names)}]"
        lines.append(f"{s['name']:<{width}}  {'yes' if s['enabled'] else 'no ':<3}  {s['state'] or '-':<8}  {what}")
        pad = " " * (width + 2)
        if s["tools"]:
            ready_tools += sum(t["enabled"] for t in s["tools"])
            lines.append(pad + "tools: " + ", ".join(t["name"] + ("" if t["enabled"] else " (off)") for t in s["tools"]))
        elif s["disabled_tools"]:
            lines.append(pad + "tools switched off: " + ", ".join(s["disabled_tools"]))
        if s["error"]:
            lines.append(pad + "error: " + s["error"])
        tail = [line for line in s["stderr_tail"].splitlines() if line.strip()][-STDERR_LINES_SHOWN:]
        if tail and s["state"] == "failed":
            lines += [pad + "stderr: " + line for line in tail]
    summary = f"{len(servers)} tool server(s)"
    if started:
        summary += f"; {ready_tools} tool(s) ready to use"
    else:
        summary += " (not started: drop --no-start to see their tools)" if any(
            s["enabled"] for s in servers) else ""
    return "\n".join([*lines, summary])
