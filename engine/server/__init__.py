"""The local OpenAI-compatible HTTP server (``hearth-cli serve``).

It reaches the engine only through ``engine.api``, ``engine.types`` and ``engine.errors``; the one
``Hearth`` runs on one engine thread (``EngineRunner``) that every request queues behind, in order.
"""
