"""Portable bundles: conversations together with their saved context, as one file.

A bundle is a zip archive (stored, not compressed: KV rows barely compress) holding
``conversations.json`` (the export format of ``engine/transfer.py``), for each conversation that had
saved context either ``context/<id>.hkv`` (a checkpoint file) or ``context/<id>.hkc`` (a chain of the
block store, docs/checkpoint-format.md §11) whose blocks are ``blocks/<id>.hkb``, each block once however
many chains use it, ``manifest.json`` (the SHA-256 of the document, of each context file and of each
block) and ``manifest.mac`` (an HMAC-SHA256 of the manifest under the exporting installation's
key, ``engine/install_key.py``). Reading checks the archive's structure before anything is imported:
only those names, no duplicates, no encryption, stored or deflate only, sizes within bounds; every
zip or zlib failure becomes a TransferError naming the problem. Installing the contexts (trust,
bounded extraction, full verification) is ``engine/bundle_install.py``.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import struct
import zipfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from engine.fsutil import NotRegularFileError, atomic_write, open_regular
from engine.install_key import sign, verify
from engine.transfer import MAX_IMPORT_BYTES, TransferError, validate_document

log = logging.getLogger(__name__)
DOCUMENT = "conversations.json"
MANIFEST = "manifest.json"
MAC = "manifest.mac"
MANIFEST_FORMAT, MANIFEST_VERSION = "hearth.bundle-manifest", 1
_CONTEXT = re.compile(r"context/([A-Za-z0-9][A-Za-z0-9._:-]{0,127})\.(?:hkv|hkc)")
_BLOCK = re.compile(r"blocks/([0-9a-f]{64})\.hkb")
CHAIN_ENTRY_SUFFIX = ".hkc"
MAX_CONTEXT_BYTES = 64 << 30  # larger than any context a model here can hold; a bigger claim is hostile
MAX_MANIFEST_BYTES = 64 << 20
MAX_MAC_BYTES = 256
MAX_ENTRIES = 1 << 20
COMPRESSIONS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}
# What zipfile and zlib raise on hostile archives (bad structure, corrupt deflate, encryption, odd methods).
ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError, RuntimeError,
              NotImplementedError, ValueError, OverflowError, struct.error)
_HEX64 = re.compile(r"[0-9a-f]{64}")


def zip_problem(name: str, what: str, exc: BaseException) -> TransferError:
    """A zip or zlib failure as one line naming the file, the entry and the problem."""
    if isinstance(exc, zlib.error):
        kind = "corrupt compressed data"
    elif isinstance(exc, EOFError):
        kind = "compressed data cut short"
    elif isinstance(exc, RuntimeError) and "encrypted" in str(exc):
        kind = "encrypted entry (Hearth bundles are never encrypted)"
    elif isinstance(exc, NotImplementedError):
        kind = "unsupported compression"
    elif isinstance(exc, OSError):
        kind = f"read error: {exc.strerror or exc}"
        return TransferError(f"cannot read {name} ({what}): {kind}")
    else:
        kind = "damaged zip structure"
    return TransferError(f"{name} is damaged: {what}: {kind} ({exc})")


# writing -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChainContext:
    """A block-store record for a bundle: its chain file's bytes and the block files it reads (hex id →
    path). The bundle carries each block once, whichever chains use it."""

    chain: bytes
    blocks: Mapping[str, Path]


# a checkpoint file, a storage tier's ``read_stream`` for one, or a chain with its blocks
ContextSource = Path | Callable[[], BinaryIO] | ChainContext


def _open_context(src: Path | Callable[[], BinaryIO]) -> BinaryIO:
    return src() if callable(src) else open(src, "rb")


def _copy_in(z: zipfile.ZipFile, entry: str, source: BinaryIO) -> dict:
    """Copy ``source`` into the archive as ``entry``; its manifest line. Hashed as copied: the manifest
    names exactly the bytes in the bundle, even if the store moves on."""
    digest, size = hashlib.sha256(), 0
    with source, z.open(zipfile.ZipInfo(entry, (1980, 1, 1, 0, 0, 0)), "w", force_zip64=True) as dst:
        while block := source.read(1 << 20):
            digest.update(block)
            dst.write(block)
            size += len(block)
    return {"entry": entry, "sha256": digest.hexdigest(), "bytes": size}


def write_bundle(path: Path, document: dict, contexts: Mapping[str, ContextSource], key: bytes | None) -> int:
    """Write ``document`` and the given checkpoints (conversation id → a file, or an opener of a tier's
    record: ``functools.partial(tier.read_stream, name)``) atomically, with a manifest signed by ``key``
    (None: unsigned, for tests of what other installations send); return how many contexts went in."""
    doc = json.dumps(document, ensure_ascii=False, indent=1).encode("utf-8")
    listed: dict[str, dict] = {}
    with atomic_write(Path(path)) as fh, zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        z.writestr(DOCUMENT, doc)
        blocks: dict[str, dict] = {}
        for cid, src in contexts.items():
            if isinstance(src, ChainContext):
                try:
                    for hex_id, path in src.blocks.items():  # each block once, before the chain naming it
                        if hex_id not in blocks:
                            blocks[hex_id] = _copy_in(z, f"blocks/{hex_id}.hkb", open(path, "rb"))
                except OSError as exc:  # a block collected meanwhile: the chain would be unusable
                    log.info("context of %s not bundled: %s", cid, exc)
                    continue
                listed[cid] = _copy_in(z, f"context/{cid}{CHAIN_ENTRY_SUFFIX}", io.BytesIO(src.chain))
                continue
            try:
                source = _open_context(src)
            except OSError as exc:  # a context that vanished meanwhile is simply not bundled
                log.info("context of %s not bundled: %s", cid, exc)
                continue
            listed[cid] = _copy_in(z, f"context/{cid}.hkv", source)
        manifest = json.dumps({"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION,
                               "document_sha256": hashlib.sha256(doc).hexdigest(), "contexts": listed,
                               "blocks": blocks}, sort_keys=True).encode("utf-8")
        z.writestr(MANIFEST, manifest)
        if key is not None:
            z.writestr(MAC, sign(key, manifest))
    return len(listed)


# reading -------------------------------------------------------------------------------------------------
def open_zip(path: Path) -> zipfile.ZipFile:
    path = Path(path)
    try:
        open_regular(path).close()  # zipfile would wait forever on a FIFO's open
        return zipfile.ZipFile(path)
    except FileNotFoundError:
        raise TransferError(f"cannot read {path.name}: no such file") from None
    except NotRegularFileError as exc:
        raise TransferError(f"cannot read {path.name}: {exc.strerror}") from None
    except ZIP_ERRORS as exc:
        raise TransferError(f"{path.name} is not a Hearth bundle (not a zip archive: {exc})") from None


def read_entry(z: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, name: str) -> bytes:
    """A small entry's bytes, refused before reading when its declared size passes ``limit``."""
    if info.file_size > limit:
        raise TransferError(f"{info.filename} in {name} claims {info.file_size} bytes; the limit is {limit}")
    try:
        with z.open(info) as src:
            data = src.read(limit + 1)  # zipfile stops at the declared size; the bound holds regardless
    except ZIP_ERRORS as exc:
        raise zip_problem(name, info.filename, exc) from None
    if len(data) > limit:
        raise TransferError(f"{info.filename} in {name} holds more than {limit} bytes")
    return data


def check_structure(z: zipfile.ZipFile, name: str) -> dict[str, zipfile.ZipInfo]:
    """Every entry by name, after checking names, duplicates, encryption, compression and sizes."""
    infos = z.infolist()
    if len(infos) > MAX_ENTRIES:
        raise TransferError(f"{name} holds {len(infos)} entries; a bundle may hold at most {MAX_ENTRIES}")
    seen: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        entry = info.filename
        if entry in seen:
            raise TransferError(f"{name} holds {entry!r} twice")
        if entry not in (DOCUMENT, MANIFEST, MAC) and _CONTEXT.fullmatch(entry) is None \
                and _BLOCK.fullmatch(entry) is None:
            raise TransferError(f"{name} holds an unexpected entry {entry!r}")
        if info.flag_bits & 0x1:
            raise TransferError(f"{name}: {entry} is encrypted; Hearth bundles are never encrypted")
        if info.compress_type not in COMPRESSIONS:
            raise TransferError(f"{name}: {entry} uses compression method {info.compress_type}; Hearth reads "
                                f"only {' and '.join(COMPRESSIONS.values())}")
        if info.file_size > MAX_CONTEXT_BYTES:
            raise TransferError(f"{name}: {entry} claims {info.file_size >> 30} GiB")
        seen[entry] = info
    return seen


def read_bundle(path: Path) -> tuple[list[dict], dict[str, str]]:
    """(validated conversations, conversation id → archive entry of its context). Raises TransferError."""
    path = Path(path)
    with open_zip(path) as z:
        if DOCUMENT not in z.namelist():
            raise TransferError(f"{path.name} is not a Hearth bundle: it has no {DOCUMENT}")
        infos = check_structure(z, path.name)
        data = read_entry(z, infos[DOCUMENT], MAX_IMPORT_BYTES, path.name)
        if MAC in infos:  # checked here, before anything is imported, not when the contexts are installed
            read_mac(z, infos[MAC], path.name)
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise TransferError(f"{DOCUMENT} in {path.name} is not valid JSON text: {exc}") from None
    convs = validate_document(doc)
    ids = {c["id"] for c in convs if c["id"]}
    contexts: dict[str, str] = {}
    for entry in infos:
        m = _CONTEXT.fullmatch(entry)
        if m is None:
            continue
        if m.group(1) not in ids:
            raise TransferError(f"{path.name}: {entry} belongs to no conversation in the bundle")
        if m.group(1) in contexts:
            raise TransferError(f"{path.name} holds two saved contexts for conversation {m.group(1)}")
        contexts[m.group(1)] = entry
    return convs, contexts


# trust ---------------------------------------------------------------------------------------------------
def read_mac(z: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> str:
    """The manifest's MAC as 64 lowercase hex digits; a TransferError for anything else (``b"\\xff" * 64``
    once reached hmac.compare_digest, which raises TypeError on non-ASCII text)."""
    data = read_entry(z, info, MAX_MAC_BYTES, name).strip()
    mac = data.decode("ascii", "replace")
    if not _HEX64.fullmatch(mac):
        raise TransferError(f"{MAC} in {name} is not a signature (expected 64 hexadecimal digits)")
    return mac


@dataclass(frozen=True)
class Signed:
    """A manifest whose MAC verified under this installation's key: context id → (sha256 hex, bytes); the
    same for each block (hex id) the chains in it read."""

    contexts: dict[str, tuple[str, int]]
    blocks: dict[str, tuple[str, int]] = field(default_factory=dict)


def signed_manifest(z: zipfile.ZipFile, name: str, key: bytes) -> tuple[Signed | None, str]:
    """(The manifest if this installation signed it and it matches the bundle's document, else None;
    why not, in words)."""
    infos = {i.filename: i for i in z.infolist()}
    if MAC not in infos or MANIFEST not in infos:
        return None, "the bundle is not signed"
    manifest = read_entry(z, infos[MANIFEST], MAX_MANIFEST_BYTES, name)
    mac = read_mac(z, infos[MAC], name)
    if not verify(key, manifest, mac):
        return None, "the bundle was signed by another installation, or altered since"
    # Past this point the manifest is our own writing; checking it anyway costs nothing.
    try:
        m = json.loads(manifest.decode("utf-8"))
        listed = m["contexts"]
        contexts = {cid: (str(v["sha256"]), int(v["bytes"])) for cid, v in listed.items()}
        blocks = {str(b): (str(v["sha256"]), int(v["bytes"])) for b, v in m.get("blocks", {}).items()}
        doc_sha = str(m["document_sha256"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"the signed manifest is malformed ({exc})"
    if not all(_HEX64.fullmatch(sha) for sha, _ in [*contexts.values(), *blocks.values()]):
        return None, "the signed manifest is malformed (a digest is not SHA-256 hex)"
    document = read_entry(z, infos[DOCUMENT], MAX_IMPORT_BYTES, name) if DOCUMENT in infos else b""
    if hashlib.sha256(document).hexdigest() != doc_sha:
        return None, "the conversations do not match the signed manifest"
    return Signed(contexts, blocks), ""
