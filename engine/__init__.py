"""Hearth's engine: GGUF models run through ONNX Runtime with a KV cache the engine owns.

Nothing under ``engine`` imports Qt; the window and the CLI are both thin layers over it.
"""

__version__ = "0.1.0"
