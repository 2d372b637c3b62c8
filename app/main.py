"""``hearth``: the desktop app's entry point.

The Qt window arrives with its own issue; until then ``hearth`` opens the terminal chat, which runs
the same engine the window will.
"""

from __future__ import annotations

import argparse
import logging
import sys

from engine.errors import HearthError
from engine.model.precision import DEFAULT_PRECISION, PRECISIONS
from engine.paths import resolve_paths
from engine.runtime.providers import PROVIDER_CHOICES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hearth", description="Chat with a local language model.")
    parser.add_argument("--data-dir", help="keep models and conversations here")
    parser.add_argument("--weights", choices=list(PRECISIONS), default=DEFAULT_PRECISION)
    parser.add_argument("--provider", choices=PROVIDER_CHOICES, default="auto")
    parser.add_argument("--model", help="a GGUF file to use instead of the default model")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from engine.terminal_chat import run_terminal_chat

    try:
        return run_terminal_chat(resolve_paths(args.data_dir).ensure(), weights=args.weights,
                                 provider=args.provider, model=args.model)
    except HearthError as exc:
        print(f"hearth: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
