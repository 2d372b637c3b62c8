"""``hearth-cli serve``: start the server, and on SIGINT/SIGTERM stop every generation at its next
token, save what is live (``Hearth.close``) and exit 0."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys

from engine.api import resolve_paths, terminal_safe
from engine.errors import HearthError
from engine.server.accounts import unkeyed_warning
from engine.server.backend import ModelHost
from engine.server.config import (
    DEFAULT_HOST,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_QUEUE,
    DEFAULT_PORT,
    ServerConfigError,
    ServerSettings,
    read_key_file,
)
from engine.server.errors import ApiError
from engine.server.listen import ListenError, bind
from engine.server.runner import ThreadRunner

log = logging.getLogger(__name__)
SHUTDOWN_WAIT_S = 60.0  # the longest a save at shutdown may take before the process gives up on it


def add_parser(sub, common, model_options) -> None:
    p = sub.add_parser("serve", parents=[common],
                       help="a local OpenAI- and Anthropic-compatible HTTP server (the prompt cache on disk)")
    p.add_argument("--host", default=DEFAULT_HOST, help="the address to listen on (default: %(default)s; any other "
                                                        "needs an API key)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="default: %(default)s (0: any free port)")
    key = p.add_mutually_exclusive_group()
    key.add_argument("--api-key", metavar="KEY", help="clients must send 'Authorization: Bearer KEY'")
    key.add_argument("--api-key-file", metavar="FILE", help="read the API key from this file's first line")
    p.add_argument("--cors-origin", action="append", default=[], metavar="URL",
                   help="let web pages from this origin call the server (repeatable; default: none)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="also answer requests whose Host header names this (repeatable)")
    p.add_argument("--idle-unload", type=float, metavar="SECONDS", help="free the model after this long without requests")
    p.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE,
                   help="requests that may wait for the model; more get 429 (default: %(default)s)")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help="the largest request body; larger get 413 (default: %(default)s)")
    p.add_argument("--any-model", action="store_true",
                   help="run a request naming a model the library does not know (e.g. gpt-4o, claude-sonnet-4-5) "
                        "on the loaded model instead of answering 404; a request naming none always runs on it")
    p.add_argument("--provider", default="auto", help="execution provider (default: %(default)s)")
    model_options(p)
    p.set_defaults(func=cmd_serve)


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    key = read_key_file(args.api_key_file) if args.api_key_file else args.api_key
    return ServerSettings(host=args.host, port=args.port, api_key=key, cors_origins=tuple(args.cors_origin),
                          allowed_hosts=tuple(args.allow_host), max_queue=args.max_queue,
                          max_body_bytes=args.max_body_bytes, idle_unload_s=args.idle_unload,
                          any_model=args.any_model).check()


def cmd_serve(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except ServerConfigError as exc:
        sys.stderr.write(f"hearth-cli: error: {terminal_safe(str(exc))}\n")
        return 2
    try:
        sock = bind(settings.host, settings.port)  # a port in use: one line, before any model work
    except ListenError as exc:
        sys.stderr.write(f"hearth-cli: error: {terminal_safe(str(exc))}; pick another with --port\n")
        return 2
    paths = resolve_paths(args.data_dir).ensure()
    runner = ThreadRunner(settings.max_queue)
    host = ModelHost(paths, runner, model=args.model, weights=args.weights, provider=args.provider,
                     idle_unload_s=settings.idle_unload_s)
    try:
        host.require_model(host.default_model)  # an unknown --model fails here, before listening
    except ApiError as exc:
        sock.close()
        runner.close()
        sys.stderr.write(f"hearth-cli: error: {terminal_safe(exc.message)}\n")  # it may quote --model
        return 1
    return serve(host, runner, settings, sock)


def serve(host: ModelHost, runner: ThreadRunner, settings: ServerSettings, sock: socket.socket | None = None) -> int:
    """Run until SIGINT/SIGTERM, then save and return 0. ``sock``: already bound (``listen.bind``)."""
    server = build_server(host, settings)
    host.start()
    try:
        server.run(sockets=[sock] if sock is not None else None)
    finally:
        shutdown(host, runner)
    return 0


def build_server(host: ModelHost, settings: ServerSettings, announce: bool = True):
    """``announce``: say the address on stderr once listening (the CLI; the window shows it itself)."""
    import uvicorn

    from engine.server.app import create_app

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            # SIGINT/SIGTERM: generations stop at their next token, the server drains, shutdown() saves.
            # Not recorded for uvicorn to raise again afterwards: a clean stop exits 0.
            host.cancel_all()
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop waiting for open connections
            self.should_exit = True

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started and announce:
                port = self.servers[0].sockets[0].getsockname()[1] if self.servers else settings.port
                root = f"http://{_url_host(settings.host)}:{port}"
                sys.stderr.write(f"hearth-cli: serving {root}/v1\n")
                # Anthropic's clients take the root and add /v1/messages themselves
                sys.stderr.write(f"hearth-cli: Anthropic's Messages API: base URL {root} (ANTHROPIC_BASE_URL)\n")
                if warning := unkeyed_warning(settings.api_key):
                    sys.stderr.write(f"hearth-cli: warning: {warning}\n")
                sys.stderr.flush()

    # log_config None: uvicorn's records go through the process's own handler (the CLI's escapes control
    # characters) instead of handlers of uvicorn's that would write an exception's text raw
    config = uvicorn.Config(create_app(host, settings), host=settings.host, port=settings.port, log_level="warning",
                            log_config=None, timeout_graceful_shutdown=30, server_header=False)
    return Server(config)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def shutdown(host: ModelHost, runner: ThreadRunner) -> None:
    """Stop everything running, then save on the engine thread and wait for it."""
    host.cancel_all()

    def save() -> None:
        try:
            saved = host.close()
            sys.stderr.write("hearth-cli: context saved, stopped\n")
            log.info("closed: %s", saved)
        except HearthError as exc:
            sys.stderr.write(f"hearth-cli: warning: could not save the live context: {terminal_safe(str(exc))}\n")

    runner.close(last=save, timeout=SHUTDOWN_WAIT_S)

