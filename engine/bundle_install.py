"""Installing a bundle's saved contexts: trust first, then bounded extraction, then full verification.

A context is extracted only if this installation signed the bundle (``engine/bundle.py``) or the
user chose to trust it. Extraction never trusts a size: the checkpoint header is read from the first
bytes of the entry and checked against the local model before anything is written; the entry's
declared size must lie between the smallest checkpoint and the most this model's context can hold
(context length × bytes per token, plus headers); free space is checked; the copy streams with a
running byte budget. Any failure removes the temp file, so nothing partial is left behind, and the
conversation's context is simply rebuilt when it is opened.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from engine.bundle import CHAIN_ENTRY_SUFFIX, ZIP_ERRORS, open_zip, read_entry, signed_manifest, zip_problem
from engine.checkpoint.block_store import BLOCKS_DIR, IMPORT_DIR_PREFIX, MAX_CHAIN_FILE_BYTES
from engine.checkpoint.blocks import block_path
from engine.checkpoint.chain import ChainReader, records_of, unpack_chain
from engine.checkpoint.format import (
    HEADER_SIZE,
    PLAIN_WORDS,
    RECORD_HEADER_SIZE,
    CheckpointError,
    FileHeader,
    Identity,
    Reason,
    unpack_header,
)
from engine.checkpoint.reader import check_identity
from engine.checkpoint.status import VALID, checkpoint_status
from engine.checkpoint.tier import StorageTier
from engine.checkpoint.writer import write_new
from engine.errors import TransferError
from engine.private_files import open_private, private_dir

log = logging.getLogger(__name__)
UNTRUSTED, NO_SPACE, BUNDLE_DAMAGED, NO_MODEL = "untrusted", "no_space", "bundle_damaged", "no_model"
FOREIGN = "saved context from another installation: rebuilt"
SPACE_HEADROOM = 16 << 20  # leave the disk this much beyond the context itself
CHUNK = 1 << 20


@dataclass
class InstallReport:
    used: list[str] = field(default_factory=list)  # owners whose context was installed
    rebuilt: dict[str, str] = field(default_factory=dict)  # owner → reason id
    notes: dict[str, str] = field(default_factory=dict)  # owner → one line for the person importing


class _Refused(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def size_bounds(header: FileHeader, context_length: int) -> tuple[int, int]:
    """(smallest, largest) byte size a checkpoint with this header can have for a model whose context
    holds ``context_length`` tokens: one record of one token, up to a record per token filling it."""
    smallest = HEADER_SIZE + RECORD_HEADER_SIZE + header.payload_bytes(1)
    largest = HEADER_SIZE + context_length * RECORD_HEADER_SIZE + header.payload_bytes(context_length)
    return smallest, largest


def install_contexts(bundle: Path, entries: dict[str, str], owners: dict[str, str], store: StorageTier,
                     identity: Identity | None, vocab_size: int | None, key: bytes, trust: bool = False) -> InstallReport:
    """Install each context (original id → entry) for its new owner (original id → new id) when it is
    trusted (signed by ``key``'s installation, or ``trust``) and fully verifies against the local model."""
    report = InstallReport()
    todo = {orig: entry for orig, entry in entries.items() if orig in owners}
    if not todo:
        return report
    if identity is None:
        for orig in todo:
            _refuse(report, owners[orig], NO_MODEL, "no model to check the saved context against: rebuilt")
        return report
    bundle = Path(bundle)
    with open_zip(bundle) as z:
        signed, why = None, ""
        if not trust:
            try:
                signed, why = signed_manifest(z, bundle.name, key)
            except TransferError as exc:  # a manifest too big or unreadable signs nothing
                why = str(exc)
        for orig, entry in todo.items():
            owner = owners[orig]
            expected = None
            if not trust:
                expected = signed.contexts.get(orig) if signed else None
                if expected is None:
                    log.info("context of %s not used: %s", owner, why or "not listed in the signed manifest")
                    _refuse(report, owner, UNTRUSTED, FOREIGN)
                    continue
            try:
                if entry.endswith(CHAIN_ENTRY_SUFFIX):
                    _install_chain(z, _info(z, entry), owner, store, identity, vocab_size, expected,
                                   signed.blocks if signed is not None and not trust else None)
                else:
                    _install(z, _info(z, entry), owner, store, identity, vocab_size, expected)
            except _Refused as exc:
                _refuse(report, owner, exc.reason, f"{exc}: rebuilt")
                continue
            report.used.append(owner)
            report.notes[owner] = "saved context used" + (" (trusted by you)" if trust else "")
    return report


def _info(z: zipfile.ZipFile, entry: str) -> zipfile.ZipInfo:
    try:
        return z.getinfo(entry)
    except KeyError:  # the file changed since it was read
        raise _Refused(BUNDLE_DAMAGED, f"{entry} is no longer in the bundle") from None


def _refuse(report: InstallReport, owner: str, reason: str, note: str) -> None:
    report.rebuilt[owner] = reason
    report.notes[owner] = note


def _install(z: zipfile.ZipFile, info: zipfile.ZipInfo, owner: str, store: StorageTier, identity: Identity,
             vocab_size: int | None, expected: tuple[str, int] | None) -> None:
    # The tier stages the entry and installs it as the owner's record (the header was checked to be
    # this model's); nothing here names or moves a checkpoint file.
    with store.staging(owner, identity.model_fp) as tmp:
        digest = _extract(z, info, tmp, store, identity, expected)
        if expected is not None and digest != expected[0]:
            raise _Refused(UNTRUSTED, "the saved context does not match the bundle's signed manifest")
        status, problem, _ = checkpoint_status(tmp, identity, vocab_size, full=True)
        if status != VALID:
            reason = problem.reason if problem else status
            raise _Refused(reason, f"{PLAIN_WORDS.get(reason, reason)} ({problem})")
        # a context this installation signed may be shared with other chats; one the user trusts may not
        store.install(tmp, owner, identity.model_fp, isolated=expected is None)


def _install_chain(z: zipfile.ZipFile, info: zipfile.ZipInfo, owner: str, store: StorageTier, identity: Identity,
                   vocab_size: int | None, expected: tuple[str, int] | None,
                   signed_blocks: dict[str, tuple[str, int]] | None) -> None:
    """A chain and the blocks it reads that the store lacks, extracted (each bounded as a checkpoint file
    is) into a private folder, verified whole (every block's checksums, its identity re-derived from its
    parent and tokens, the chain against the model) and stored; the folder goes in every case."""
    try:  # the bundle reader's bounded read of a small entry
        data = read_entry(z, info, MAX_CHAIN_FILE_BYTES, Path(z.filename or "bundle").name)
    except TransferError as exc:
        raise _Refused(Reason.TOO_LARGE if "limit" in str(exc) or "more than" in str(exc) else BUNDLE_DAMAGED,
                       str(exc)) from None
    if expected is not None and (hashlib.sha256(data).hexdigest(), len(data)) != expected:
        raise _Refused(UNTRUSTED, "the saved context does not match the bundle's signed manifest")
    try:
        chain = unpack_chain(data, info.filename)
        check_identity(chain.header, identity)
    except CheckpointError as exc:
        raise _Refused(exc.reason, f"{exc.plain} ({exc})") from None
    have = getattr(store, "has_block", lambda physical: False)
    stage = Path(tempfile.mkdtemp(prefix=IMPORT_DIR_PREFIX, dir=store.side_file("import").parent))
    try:
        for physical in dict.fromkeys(n.physical for n in chain.nodes):
            if have(physical):
                continue  # stored here already: the store's own copy serves (and is checked on every read)
            hex_id = physical.hex()
            block = _info(z, f"blocks/{hex_id}.hkb")
            want = signed_blocks.get(hex_id) if signed_blocks is not None else None
            if signed_blocks is not None and want is None:
                raise _Refused(UNTRUSTED, f"block {hex_id[:16]} is not in the bundle's signed manifest")
            target = block_path(stage / BLOCKS_DIR, physical)
            private_dir(target.parent)
            digest = _extract(z, block, target, store, identity, want)
            if want is not None and digest != want[0]:
                raise _Refused(UNTRUSTED, f"block {hex_id[:16]} does not match the bundle's signed manifest")
        staged = stage / f"context{CHAIN_ENTRY_SUFFIX}"
        staged.write_bytes(data)
        roots = [stage / BLOCKS_DIR, *([store.blocks_root] if hasattr(store, "blocks_root") else [])]
        status, problem, _ = checkpoint_status(lambda: ChainReader(roots, staged, chain), identity, vocab_size,
                                               full=True)
        if status != VALID:
            reason = problem.reason if problem else status
            raise _Refused(reason, f"{PLAIN_WORDS.get(reason, reason)} ({problem})")
        with ChainReader(roots, staged, chain) as reader:
            records = records_of(reader)
        if hasattr(store, "install_records"):
            store.install_records(records, chain.header, owner, identity.model_fp, isolated=expected is None)
        else:  # a tier of checkpoint files: the chain becomes one
            with store.staging(owner, identity.model_fp) as tmp:
                h = chain.header
                write_new(tmp, Identity(h.model_fp, h.tokenizer_fp, h.shape, h.label), records, h.encoding)
                store.install(tmp, owner, identity.model_fp, isolated=expected is None)
    except CheckpointError as exc:
        raise _Refused(exc.reason, f"{exc.plain} ({exc})") from None
    except OSError as exc:
        raise _Refused(Reason.IO_ERROR, f"{info.filename} could not be stored: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _extract(z: zipfile.ZipFile, info: zipfile.ZipInfo, tmp: Path, store: StorageTier, identity: Identity,
             expected: tuple[str, int] | None) -> str:
    """Stream ``info`` into ``tmp`` within the bounds its checkpoint header allows; its SHA-256 hex."""
    name, declared = info.filename, info.file_size
    try:
        with z.open(info) as src:
            head = src.read(HEADER_SIZE)
            try:
                header = unpack_header(head)
                check_identity(header, identity)
            except CheckpointError as exc:
                raise _Refused(exc.reason, f"{exc.plain} ({exc})") from None
            smallest, largest = size_bounds(header, identity.shape.context_length)
            if declared > largest:
                raise _Refused(Reason.TOO_LARGE, f"{name} declares {declared} bytes; a saved context of this model "
                                                 f"holds at most {largest}")
            if declared < smallest:
                raise _Refused(Reason.TRUNCATED, f"{name} declares {declared} bytes; its header needs at least "
                                                 f"{smallest}")
            if expected is not None and declared != expected[1]:
                raise _Refused(UNTRUSTED, f"{name} declares {declared} bytes; the signed manifest says {expected[1]}")
            room = store.free_space()
            free = room[0] if room is not None else shutil.disk_usage(tmp.parent).free
            if free < declared + SPACE_HEADROOM:
                raise _Refused(NO_SPACE, f"not enough free disk space for {name}: it needs {declared >> 20} MiB "
                                         f"and {SPACE_HEADROOM >> 20} MiB to spare, {free >> 20} MiB are free")
            digest = hashlib.sha256(head)
            written = len(head)
            with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as dst:
                dst.write(head)
                while chunk := src.read(min(CHUNK, declared - written + 1)):  # +1: sees a stream that runs on
                    written += len(chunk)
                    if written > declared:
                        raise _Refused(Reason.TOO_LARGE, f"{name} holds more than the {declared} bytes it declares")
                    digest.update(chunk)
                    dst.write(chunk)
                dst.flush()
                os.fsync(dst.fileno())
            if written != declared:
                raise _Refused(Reason.TRUNCATED, f"{name} holds {written} bytes; it declares {declared}")
            return digest.hexdigest()
    except _Refused:
        raise
    except OSError as exc:  # reading the bundle or writing the temp file (a full disk)
        raise _Refused(Reason.IO_ERROR, f"{name} could not be extracted: {exc.strerror or exc}") from None
    except ZIP_ERRORS as exc:
        problem: TransferError = zip_problem(Path(z.filename or "bundle").name, name, exc)
        raise _Refused(BUNDLE_DAMAGED, str(problem)) from None
