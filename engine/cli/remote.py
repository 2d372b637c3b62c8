"""``hearth-cli remote add | ls | rm``: the OpenAI-compatible servers whose models chat as ``NAME/MODEL``
(docs/remote.md). Keys go to the secret store (the system keyring, else a private file); no output, --json
included, ever shows one: ``ls`` says only whether a server has a key.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from engine.api import RemoteBackend, RemoteRegistry, read_secret_file, terminal_safe
from engine.cli.common import data_paths, emit
from engine.errors import HearthError

log = logging.getLogger(__name__)

CHECK_TIMEOUT_S = 3.0  # ``add`` only peeks at the server: a dead one is added all the same, with a warning


def add_parser(sub, common: argparse.ArgumentParser) -> None:
    remote = sub.add_parser("remote", parents=[common],
                            help="OpenAI-compatible servers (vLLM, SGLang, llama.cpp, Ollama, another Hearth) to chat "
                                 "with as NAME/MODEL")
    rsub = remote.add_subparsers(dest="remote_command", required=True, metavar="ACTION")
    add = rsub.add_parser("add", parents=[common], help="add a server: its models then chat as NAME/MODEL")
    add.add_argument("name", metavar="NAME", help="1-32 lower-case letters, digits, . _ - (before the slash)")
    add.add_argument("url", metavar="URL", help="the server's address, e.g. http://gpu-box:8000 (a /v1 is dropped)")
    add.add_argument("--api-key-file", type=Path, metavar="FILE",
                     help="a file holding the server's API key (kept in the keyring or a private file, never shown)")
    add.add_argument("--replace", action="store_true", help="replace a server of that name (and its key)")
    add.set_defaults(func=cmd_add)
    ls = rsub.add_parser("ls", parents=[common], help="the servers: name, address, whether a key is kept")
    ls.set_defaults(func=cmd_ls)
    rm = rsub.add_parser("rm", parents=[common], help="remove a server and its key (its chats stay)")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(func=cmd_rm)


def cmd_add(args: argparse.Namespace) -> int:
    paths = data_paths(args)
    registry = RemoteRegistry(paths.data)
    key = None
    if args.api_key_file is not None:  # read (and checked) before anything is added
        key = read_secret_file(args.api_key_file, f"the API key of server {args.name}")
    server = registry.add(args.name, args.url, key, replace=args.replace)
    backend = RemoteBackend(paths, server, key, timeout_s=CHECK_TIMEOUT_S)
    try:
        models, problem = len(backend.list_models()), None
    except HearthError as exc:
        models, problem = None, str(exc)
    finally:
        backend.close()
    where = registry.secrets.where if key is not None else None
    text = f"added server {server.name} ({server.base_url})"
    if key is not None:
        text += f", its key kept in {where}"
    if models is not None:
        text += f"; it lists {models} model(s): chat with them as {server.name}/MODEL (hearth-cli model ls)"
    else:
        sys.stderr.write(terminal_safe(f"warning: {problem}; the server is added all the same") + "\n")
    emit(args, {"name": server.name, "url": server.base_url, "key": server.has_key, "key_kept_in": where,
                "models": models, "problem": problem}, text)
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    servers = RemoteRegistry(data_paths(args).data).servers()
    width = max((len(s.name) for s in servers), default=4)
    lines = [f"{'NAME':<{width}}  KEY  URL"] + [f"{s.name:<{width}}  {'yes' if s.has_key else 'no ':<3}  {s.base_url}"
                                                 for s in servers]
    lines.append(f"{len(servers)} server(s)" + ("" if servers else "; add one with hearth-cli remote add NAME URL"))
    emit(args, {"servers": [{"name": s.name, "url": s.base_url, "key": s.has_key} for s in servers]}, "\n".join(lines))
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    RemoteRegistry(data_paths(args).data).remove(args.name)
    emit(args, {"removed": args.name}, f"removed server {args.name} and its key (its chats are kept)")
    return 0
