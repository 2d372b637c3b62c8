"""``python -m engine.cli``: the same as ``hearth-cli``."""

import sys

from engine.cli.main import main

if __name__ == "__main__":  # imported by name (the self-test imports every module), it does nothing
    sys.exit(main())
