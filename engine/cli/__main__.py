"""``python -m engine.cli``: the same as ``hearth-cli``."""

import sys

from engine.cli.main import main

sys.exit(main())
