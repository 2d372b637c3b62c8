"""PyInstaller entry point for the command line (``hearth-cli``)."""

import sys

from engine.cli import main

if __name__ == "__main__":
    sys.exit(main())
