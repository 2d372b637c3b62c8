"""Text: the tokenizer and chat template a GGUF carries, and streaming detokenization."""
