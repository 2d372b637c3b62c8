"""``hearth``: the desktop app. ``hearth --terminal`` keeps the terminal chat."""

from __future__ import annotations

import argparse
import logging
import sys

from engine.api import DEFAULT_PRECISION, PRECISIONS, PROVIDER_CHOICES, log_to_stderr
from engine.errors import HearthError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hearth", description="Chat with a local language model.")
    parser.add_argument("--data-dir", help="keep models and conversations here (default: $HEARTH_HOME or the user dirs)")
    parser.add_argument("--weights", choices=list(PRECISIONS), default=DEFAULT_PRECISION)
    parser.add_argument("--provider", choices=PROVIDER_CHOICES, default="auto")
    parser.add_argument("--model", help="a GGUF file to use instead of the default model")
    parser.add_argument("--terminal", action="store_true", help="chat in the terminal instead of a window")
    parser.add_argument("--browse", action="store_true", help="open the saved-conversation browser too")
    parser.add_argument("--self-test", action="store_true",
                        help="open the window, run one chat turn, save, restore and verify its context, print a report "
                             "and exit (in a throwaway data dir unless --data-dir is given)")
    parser.add_argument("--startup-probe", action="store_true",
                        help="print when the window became interactive and the model ready (JSON), then exit")
    parser.add_argument("--debug", action="store_true", help="debug logging")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    modes = [flag for flag, on in (("--self-test", args.self_test), ("--startup-probe", args.startup_probe),
                                   ("--terminal", args.terminal), ("--browse", args.browse)) if on]
    if len(modes) > 1 and modes[0] in ("--self-test", "--startup-probe"):
        parser.error(f"{modes[0]} cannot be combined with {', '.join(modes[1:])}")
    log_to_stderr(logging.DEBUG if args.debug else logging.WARNING)  # escaped: records may quote stored text
    if args.self_test:
        from app.self_test import run_self_test

        return run_self_test(args.data_dir, model=args.model, weights=args.weights, provider=args.provider)
    from app.config import AppConfig

    try:
        config = AppConfig.from_args(args.data_dir, args.model, args.weights, args.provider)
        if args.terminal:
            from engine.cli.terminal_chat import run_terminal_chat

            return run_terminal_chat(config.paths, weights=args.weights, provider=args.provider, model=args.model)
        return run_window(config, browse=args.browse, probe=args.startup_probe)
    except HearthError as exc:
        print(f"hearth: error: {exc}", file=sys.stderr)
        return 1


def run_window(config, browse: bool = False, probe: bool = False) -> int:
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication
    from PySide6.QtWidgets import QApplication

    from app.single_instance import SingleInstance

    QGuiApplication.setHighDpiScaleFactorRoundingPolicy(Qt.HighDpiScaleFactorRoundingPolicy.PassThrough)
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Hearth")
    app.setOrganizationName("Hearth")
    app.setDesktopFileName("hearth")
    from importlib.resources import files

    from PySide6.QtGui import QIcon

    app.setWindowIcon(QIcon.fromTheme("hearth", QIcon(str(files("resources") / "hearth.svg"))))
    instance = SingleInstance(config.paths.data)
    if instance.already_running():
        print(f"hearth: already running for {config.paths.data}; brought its window to the front", file=sys.stderr)
        return 0
    instance.listen()
    from app.theme import apply_saved_theme

    apply_saved_theme(config.settings_file)  # before the first dialog: the database check may show one
    if not database_usable(config):
        return 1
    from app.main_window import MainWindow

    window = MainWindow(config)

    def bring_to_front() -> None:
        window.showNormal()
        window.raise_()
        window.activateWindow()

    instance.activated.connect(bring_to_front)
    window.show()
    if browse:
        window.show_browser()
    if probe:
        from app.startup_probe import StartupProbe

        StartupProbe(app, window)
    return app.exec()


def database_usable(config) -> bool:
    """Check the conversation database (and make the day's backup) off the UI thread, the event loop
    running meanwhile; a damaged one gets the recovery dialog (app/db_guard.py). False: the person quit."""
    from PySide6.QtCore import QEventLoop

    from app.db_guard import DatabaseGuard

    guard = DatabaseGuard(config.paths)
    loop, outcome = QEventLoop(), []
    guard.passed.connect(lambda: (outcome.append(True), loop.quit()))
    guard.gave_up.connect(lambda: (outcome.append(False), loop.quit()))
    guard.start()
    loop.exec()
    guard.wait_job()
    return outcome[0]


if __name__ == "__main__":
    sys.exit(main())
