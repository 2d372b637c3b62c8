"""PyInstaller entry point for the command line (``hearth-cli``)."""

import multiprocessing
import sys

from engine.cli.main import main

if __name__ == "__main__":
    multiprocessing.freeze_support()  # a frozen build runs the chat template check as a child of itself
    sys.exit(main())
