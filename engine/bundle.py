"""Portable bundles: conversations together with their saved context, as one file.

A bundle is a zip archive (stored, not compressed: KV rows barely compress) holding
``conversations.json`` (the export format of ``engine/transfer.py``) and ``context/<id>.hkv``, a
checkpoint per conversation that had one. On import the conversations are validated and inserted
all or nothing; each context is then extracted into the store under its new owner's name and used
only if it fully verifies against the local model (fingerprints and every checksum). Otherwise it is
dropped, and the conversation's context is rebuilt the first time it is opened.
"""

from __future__ import annotations

import json
import logging
import os
import re
import zipfile
from pathlib import Path

from engine.checkpoint.format import Identity
from engine.checkpoint.status import VALID, checkpoint_status
from engine.checkpoint.store import CheckpointStore, conversation_file
from engine.fsutil import atomic_write, fsync_dir
from engine.transfer import MAX_IMPORT_BYTES, TransferError, validate_document

log = logging.getLogger(__name__)
DOCUMENT = "conversations.json"
_CONTEXT = re.compile(r"context/([A-Za-z0-9][A-Za-z0-9._:-]{0,127})\.hkv")
MAX_CONTEXT_BYTES = 64 << 30  # larger than any context a model here can hold; a bigger claim is hostile


def write_bundle(path: Path, document: dict, contexts: dict[str, Path]) -> int:
    """Write ``document`` and the given checkpoint files (conversation id → path) atomically; return
    how many contexts went in."""
    added = 0
    with atomic_write(Path(path)) as fh, zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        z.writestr(DOCUMENT, json.dumps(document, ensure_ascii=False, indent=1))
        for cid, src in contexts.items():
            try:
                z.write(src, f"context/{cid}.hkv")
                added += 1
            except OSError as exc:  # a context that vanished meanwhile is simply not bundled
                log.info("context of %s not bundled: %s", cid, exc)
    return added


def read_bundle(path: Path) -> tuple[list[dict], dict[str, str]]:
    """(validated conversations, conversation id → archive entry of its context). Raises TransferError."""
    path = Path(path)
    try:
        z = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise TransferError(f"cannot read {path.name}: no such file") from None
    except (zipfile.BadZipFile, OSError) as exc:
        raise TransferError(f"{path.name} is not a Hearth bundle (not a zip archive: {exc})") from None
    with z:
        try:
            info = z.getinfo(DOCUMENT)
        except KeyError:
            raise TransferError(f"{path.name} is not a Hearth bundle: it has no {DOCUMENT}") from None
        if info.file_size > MAX_IMPORT_BYTES:
            raise TransferError(f"{DOCUMENT} in {path.name} claims {info.file_size >> 20} MiB; the limit is "
                                f"{MAX_IMPORT_BYTES >> 20} MiB")
        try:
            doc = json.loads(z.read(info).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise TransferError(f"{DOCUMENT} in {path.name} is not valid JSON text: {exc}") from None
        except (zipfile.BadZipFile, OSError) as exc:
            raise TransferError(f"{path.name} is damaged: {exc}") from None
        convs = validate_document(doc)
        ids = {c["id"] for c in convs if c["id"]}
        contexts: dict[str, str] = {}
        for entry in z.infolist():
            if entry.filename == DOCUMENT or entry.is_dir():
                continue
            m = _CONTEXT.fullmatch(entry.filename)
            if m is None:
                raise TransferError(f"{path.name} holds an unexpected entry {entry.filename!r}")
            if m.group(1) not in ids:
                raise TransferError(f"{path.name}: {entry.filename} belongs to no conversation in the bundle")
            if entry.file_size > MAX_CONTEXT_BYTES:
                raise TransferError(f"{path.name}: {entry.filename} claims {entry.file_size >> 30} GiB")
            contexts[m.group(1)] = entry.filename
    return convs, contexts


def install_contexts(bundle: Path, entries: dict[str, str], owners: dict[str, str], store: CheckpointStore,
                     identity: Identity | None, vocab_size: int | None) -> dict:
    """Extract each context (original id → entry) for its new owner (original id → new id) and keep
    it only if it fully verifies against the local model. Returns {"used": [...], "rebuilt": {id: reason}}."""
    used, rebuilt = [], {}
    with zipfile.ZipFile(bundle) as z:
        for original, entry in entries.items():
            owner = owners.get(original)
            if owner is None:
                continue
            final = store.path(conversation_file(owner))
            tmp = final.with_name(f".{final.name}.import.tmp")
            try:
                with z.open(entry) as src, open(tmp, "wb") as dst:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
                    dst.flush()
                    os.fsync(dst.fileno())
            except (OSError, zipfile.BadZipFile) as exc:
                tmp.unlink(missing_ok=True)
                rebuilt[owner] = f"io_error: {exc}"
                continue
            status, problem, _ = checkpoint_status(tmp, identity, vocab_size, full=True)
            if status != VALID:
                tmp.unlink(missing_ok=True)
                rebuilt[owner] = problem.reason if problem else status
                continue
            with store.lock.held():
                os.replace(tmp, final)
                fsync_dir(final.parent)
            store.reconcile()
            store.conversation_entry(owner)
            used.append(owner)
    return {"used": used, "rebuilt": rebuilt}
