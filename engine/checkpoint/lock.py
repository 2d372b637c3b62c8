"""The checkpoint store's inter-process lock: the file lock of engine/file_lock.py, held only around each
operation (a save, a load, an eviction), so the window and ``hearth-cli`` can share one store."""

from engine.file_lock import LockFileError, StoreBusyError, StoreLock

__all__ = ["LockFileError", "StoreBusyError", "StoreLock"]
