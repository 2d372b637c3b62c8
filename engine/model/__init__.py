"""Model files: reading GGUF, converting it to ONNX, fetching the default model."""
