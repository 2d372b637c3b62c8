"""Saved-context (checkpoint) files offline, with no model loaded: the store, one file's header and records,
its full verification (``hearth-cli kv``)."""

from __future__ import annotations

from pathlib import Path

from engine.checkpoint.block_store import BlockStore
from engine.checkpoint.chain import open_saved
from engine.checkpoint.format import ENCODINGS, CheckpointError, Identity
from engine.checkpoint.status import checkpoint_status
from engine.paths import HearthPaths

KV_ENCODINGS = ENCODINGS

__all__ = ["KV_ENCODINGS", "checkpoint_store", "describe_checkpoint", "model_identity", "verify_checkpoint"]


def checkpoint_store(paths: HearthPaths) -> BlockStore:
    """The data dir's checkpoint store, opened on its own (it works while the conversation database is damaged)."""
    return BlockStore(paths.checkpoints)


def describe_checkpoint(path: Path) -> dict:
    """Header and record headers of a checkpoint, as far as they can be read (no model needed)."""
    out: dict = {"path": str(path)}
    try:
        with open_saved(path) as reader:
            h = reader.read_header()
            out["size"] = reader.size
            out["header"] = {"version": h.version, "layout": h.layout, "encoding": h.encoding, "dtype": h.shape.dtype,
                             "layers": h.shape.n_layers, "kv_heads": h.shape.n_kv_heads, "head_dim": h.shape.head_dim,
                             "context_length": h.shape.context_length, "model": h.label,
                             "model_fingerprint": h.model_fp.hex(), "tokenizer_fingerprint": h.tokenizer_fp.hex(),
                             "file_id": h.file_id.hex(), "created_ms": h.created_ms, "last_used_ms": h.last_used_ms,
                             "hits": h.hits, "bytes_per_token": h.bytes_per_token,
                             "exact_bytes_per_token": h.shape.bytes_per_token}
            records, problem = reader.scan()
            out["records"] = [{"seq": r.seq, "start": r.start, "end": r.end, "text_len": r.text_len,
                               "text_sha256": r.text_sha.hex(), "saved_ms": r.saved_ms, "reason": r.reason,
                               "payload_bytes": r.payload_bytes} for r in records]
            out["tokens"] = records[-1].end if records else 0
    except CheckpointError as exc:
        problem = exc
    out["problem"] = None if problem is None else {"reason": problem.reason, "message": str(problem)}
    return out


def model_identity(paths: HearthPaths, model: str | None, weights: str) -> tuple[Identity, int]:
    """The identity checkpoints of ``model`` at ``weights`` carry, and its vocabulary size (header only)."""
    from engine.checkpoint.identity import gguf_identity
    from engine.loader import resolve_gguf

    return gguf_identity(resolve_gguf(paths, model), weights)


def verify_checkpoint(path: Path, identity: Identity | None, vocab_size: int | None) -> dict:
    """Full verification: header, identity (when a model is known), every record's tokens and rows."""
    status, problem, tokens = checkpoint_status(path, identity, vocab_size, full=True)
    return {"path": str(path), "status": status, "reason": problem.reason if problem else None,
            "message": str(problem) if problem else "", "tokens": tokens}
