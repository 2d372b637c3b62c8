"""Where a conversation's saved context lies: one record per (conversation, model), named by both.

Hearth saves to the block store, where a record is a chain file (``.hkc``) naming its blocks; a raw
``CheckpointStore`` (the file tier) and stores from before the block store hold checkpoint files (``.hkv``).
"""

from __future__ import annotations

from pathlib import Path

from engine.checkpoint.block_store import BLOCKS_DIR
from engine.checkpoint.blocks import BLOCK_SUFFIX
from engine.checkpoint.chain import CHAIN_SUFFIX, read_chain
from engine.checkpoint.identity import engine_identity
from engine.checkpoint.store import SUFFIX, conversation_file, conversation_key
from engine.generation import Engine


def conv_path(root: Path, engine: Engine, conversation: str = "c") -> Path:
    """The conversation's record under ``engine``'s model: its chain file when there is one, else its
    checkpoint file."""
    file = Path(root) / conversation_file(conversation, engine_identity(engine).model_fp)
    chain = file.with_name(file.name[: -len(SUFFIX)] + CHAIN_SUFFIX)
    return chain if chain.exists() else file


def conv_paths(root: Path, conversation: str) -> list[Path]:
    """Every model's record of the conversation (chain or checkpoint files)."""
    key = conversation_key(conversation)
    return sorted([*Path(root).glob(f"{key}-*{SUFFIX}"), *Path(root).glob(f"{key}-*{CHAIN_SUFFIX}")])


def only_conv_path(root: Path, conversation: str) -> Path:
    """The conversation's one record (a test that ran one model)."""
    paths = conv_paths(root, conversation)
    assert len(paths) == 1, paths
    return paths[0]


def block_files(root: Path) -> list[Path]:
    """Every block file of a block store."""
    return sorted((Path(root) / BLOCKS_DIR).glob(f"*/*{BLOCK_SUFFIX}"))


def chain_block_paths(root: Path, chain_file: Path) -> list[Path]:
    """The block files a chain reads, in order."""
    from engine.checkpoint.blocks import block_path

    chain = read_chain(chain_file, 64 << 20)
    return [block_path(Path(root) / BLOCKS_DIR, n.physical) for n in chain.nodes]
