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


def as_checkpoint_file(record: Path) -> Path:
    """The record as one checkpoint file: a chain exported as a bundle carries it (beside the store, in
    ``exported/``), a checkpoint file as it is. For tests that read, forge or reseal a record's bytes."""
    record = Path(record)
    if not record.name.endswith(CHAIN_SUFFIX):
        return record
    from engine.checkpoint.block_store import BlockStore

    out = record.parent.parent / "exported" / (record.name[: -len(CHAIN_SUFFIX)] + SUFFIX)
    out.parent.mkdir(exist_ok=True)
    store = BlockStore(record.parent)
    try:
        with store.read_stream(record.name) as src:
            out.write_bytes(src.read())
    finally:
        store.close()
    return out


def reseal_chain(root: Path, chain_file: Path, poison) -> None:
    """Rewrite every block a chain reads with its rows changed by ``poison`` (given each block's rows as
    one array [2 × layers × KV heads, n, dim], changed in place) and every checksum recomputed: what
    checksums cannot tell from the real thing (the tokens, and so the identities, are kept)."""
    import numpy as np

    from engine.checkpoint.blocks import BlockFileReader, block_path, write_block
    from engine.checkpoint.format import Identity

    chain = read_chain(chain_file, 64 << 20)
    h = chain.header
    s = h.shape
    for physical in dict.fromkeys(n.physical for n in chain.nodes):
        start = next(n.start for n in chain.nodes if n.physical == physical)
        path = block_path(Path(root) / BLOCKS_DIR, physical)
        with BlockFileReader(path, physical, start) as reader:
            reader.read_header()
            [rec], problem = reader.scan()
            assert problem is None
            tokens = reader.read_tokens(rec, 1 << 31)
            rows = np.zeros((2 * s.n_layers * s.n_kv_heads, rec.n_tokens, s.head_dim), np.dtype(s.dtype))
            _, problem = reader.load_rows([rec], lambda a, b, rows=rows: list(rows))
            assert problem is None
        poison(rows)
        write_block(path, Identity(h.model_fp, h.tokenizer_fp, s, h.label), h.layout, physical, start, tokens,
                    [np.ascontiguousarray(r) for r in rows])
