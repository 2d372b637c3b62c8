"""Hearth's engine: GGUF models run through ONNX Runtime with a KV cache the engine owns.

Nothing under ``engine`` imports Qt; the window and the CLI are both thin layers over it.
"""

import os

__version__ = "0.1.0"

# ONNX Runtime 1.29+ sends usage telemetry from Linux too and writes a device id under
# ~/.cache/Microsoft; a local, private chat app opts out before onnxruntime is first imported (every
# import of it is inside this package). Setting the variable to 0 yourself turns it back on.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
