"""PyInstaller entry point for the desktop app (``hearth``)."""

import sys

from app.main import main

if __name__ == "__main__":
    sys.exit(main())
