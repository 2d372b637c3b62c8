"""Backends: what a front end runs turns on. ``Backend`` (protocol.py) is the seam; ``engine.api.Hearth``
is the local one (ONNX Runtime in this process). docs/architecture.md ("How to add a backend") says how to add another."""

from engine.backends.protocol import Backend

__all__ = ["Backend"]
