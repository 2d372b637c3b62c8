"""ONNX Runtime: providers, the KV cache buffers, and one forward pass at a time."""
