"""Running a test over every storage tier: the file store and the in-memory tier (tests/memory_tier.py).

A test names a store by its root directory, as the file tests always have; ``Tiers`` opens "the store at
``root``" for one kind of tier. The file store is opened afresh each time (what a restart does: the
index is reconciled with the directory); the memory tier is one per root for the test's life (RAM
outlives a session, not a process). ``plant`` and ``read_bytes`` are what a file test does with
``write_bytes`` / ``read_bytes`` in the store's directory. A test module runs over both with a fixture
``@pytest.fixture(params=TIER_KINDS) def tiers(request): return Tiers(request.param)``.
"""

from __future__ import annotations

from pathlib import Path

from engine.checkpoint.store import CheckpointStore
from engine.checkpoint.tier import StorageTier
from tests.memory_tier import MemoryTier

TIER_KINDS = ["file", "memory"]


class Tiers:
    def __init__(self, kind: str):
        self.kind = kind
        self._memory: dict[Path, MemoryTier] = {}

    def open(self, root: Path, **kw) -> StorageTier:
        root = Path(root)
        if self.kind == "file":
            return CheckpointStore(root, **kw)
        tier = self._memory.get(root)
        if tier is None:
            tier = self._memory[root] = MemoryTier(root, **kw)
        elif "budget_bytes" in kw:
            tier.budget_bytes = kw["budget_bytes"]
        return tier

    def plant(self, root: Path, name: str, data: bytes) -> None:
        """Put ``data`` in the store at ``root`` as record ``name`` (before it is opened, for files)."""
        if self.kind == "file":
            Path(root).mkdir(parents=True, exist_ok=True)
            (Path(root) / name).write_bytes(data)
        else:
            self.open(root).plant(name, data)

    def has(self, root: Path, name: str) -> bool:
        return (Path(root) / name).exists() if self.kind == "file" else self.open(root).has(name)

    def read_bytes(self, root: Path, name: str) -> bytes:
        return (Path(root) / name).read_bytes() if self.kind == "file" else self.open(root).read_bytes(name)

    def forget(self, root: Path) -> None:
        """Drop the store at ``root`` (a fresh case in the same directory)."""
        self._memory.pop(Path(root), None)

