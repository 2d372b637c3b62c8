"""``hearth-cli``: the command line, a front end. It reaches the engine only through ``engine.api``,
``engine.types`` and ``engine.errors`` (tests/test_architecture.py checks it).

``main.py`` builds the parser and runs a command; ``common.py`` holds what the command modules share
(``store.py``: chat, conversations, context; ``library.py``: the model library; ``bundle.py``: bundles;
``render.py``: the prompt a template renders; ``terminal_chat.py``: talk), and those never import each other.
"""

from engine.cli.main import main

__all__ = ["main"]
