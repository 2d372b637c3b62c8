"""Where a conversation's checkpoint lies: one file per (conversation, model), named by both."""

from __future__ import annotations

from pathlib import Path

from engine.checkpoint.identity import engine_identity
from engine.checkpoint.store import conversation_file, conversation_key
from engine.generation import Engine


def conv_path(root: Path, engine: Engine, conversation: str = "c") -> Path:
    """The conversation's checkpoint under ``engine``'s model."""
    return Path(root) / conversation_file(conversation, engine_identity(engine).model_fp)


def conv_paths(root: Path, conversation: str) -> list[Path]:
    """Every model's checkpoint of the conversation."""
    return sorted(Path(root).glob(f"{conversation_key(conversation)}-*.hkv"))


def only_conv_path(root: Path, conversation: str) -> Path:
    """The conversation's one checkpoint (a test that ran one model)."""
    paths = conv_paths(root, conversation)
    assert len(paths) == 1, paths
    return paths[0]
