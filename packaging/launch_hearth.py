"""PyInstaller entry point for the desktop app (``hearth``)."""

import multiprocessing
import sys

from app.main import main

if __name__ == "__main__":
    multiprocessing.freeze_support()  # a frozen build runs the chat template check as a child of itself
    sys.exit(main())
