"""Hearth's desktop front end (Qt). Everything slow runs in the engine, on a worker thread."""
