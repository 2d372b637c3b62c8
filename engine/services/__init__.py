"""Services over the local backend's stores, each in its own module and none a method of ``Hearth``:
saved-context administration (saved_contexts.py) and bundles (bundles.py). ``engine.api`` builds them
(``saved_contexts(hearth)``, ``bundles(hearth)``) for a backend whose ``capabilities.saved_context`` is true."""
