"""KV-cache checkpoints on disk: the file format, its reader and writer, and the store that holds them."""
