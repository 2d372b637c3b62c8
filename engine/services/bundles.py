"""Bundles: conversations with their saved context in one ``.hearth`` file (engine/bundle.py writes and
reads the file, engine/bundle_install.py verifies and installs its contexts), over the local backend's
stores. Made for each use by ``engine.api.bundles``."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from pathlib import Path

from engine.checkpoint.chain import CHAIN_SUFFIX
from engine.checkpoint.format import CheckpointError
from engine.errors import HearthError
from engine.import_dedupe import DuplicatePolicy, apply_duplicates, find_duplicates
from engine.services.local import LocalBackend
from engine.services.saved_contexts import SavedContexts
from engine.types import BundleExported, BundleImported

log = logging.getLogger(__name__)


class Bundles:
    def __init__(self, backend: LocalBackend):
        self.backend = backend

    def export_bundle(self, path: Path, document: dict, conversations: Sequence[str]) -> BundleExported:
        """Write conversations with their saved context into one file (the live one is saved first),
        signed with this installation's key so that importing it here uses the contexts."""
        from engine.bundle import write_bundle
        from engine.install_key import install_key

        sessions = self.backend.sessions
        if sessions is not None and sessions.active in conversations:
            sessions.save("switch")
        saved = SavedContexts(self.backend)
        contexts = {}
        for cid in conversations:
            entry = saved.context_entry(cid)  # a bundle holds one context per conversation: the loaded model's
            if entry is None:
                continue
            store = self.backend.checkpoints
            if entry.name.endswith(CHAIN_SUFFIX):  # a chain travels with its blocks, each block once
                try:
                    contexts[cid] = store.chain_context(entry.name)
                    continue
                except (OSError, CheckpointError) as exc:
                    log.info("context of %s not bundled: %s", cid, exc)
                    continue
            contexts[cid] = functools.partial(store.read_stream, entry.name)
        added = write_bundle(Path(path), document, contexts, install_key(self.backend.paths.data))
        return BundleExported(len(conversations), added)

    def import_bundle_contexts(self, path: Path, entries: dict[str, str], owners: dict[str, str],
                               trust: bool = False) -> BundleImported:
        """Install a bundle's saved contexts for their (new) conversations. A context is used only if
        this installation signed the bundle (or ``trust``: the user vouches for it) and it fully
        verifies against this model; the others are rebuilt when opened, and ``notes`` says why."""
        from engine.bundle_install import install_contexts
        from engine.install_key import install_key

        identity, vocab = self._local_identity()
        report = install_contexts(Path(path), entries, owners, self.backend.checkpoints, identity, vocab,
                                  install_key(self.backend.paths.data), trust)
        return BundleImported(tuple(report.used), dict(report.rebuilt), dict(report.notes), trust)

    def import_bundle(self, path: Path, trust: bool = False,
                      duplicates: DuplicatePolicy | str | None = None) -> BundleImported:
        """Import a ``.hearth`` bundle whole: its conversations (validated first; all or nothing), then
        their saved contexts as ``import_bundle_contexts``. ``conversations`` maps new ids to the bundle's.
        Chats already here (``find_duplicates``) are skipped or imported as marked copies as ``duplicates``
        says; None imports every chat as it is (a taken id gets a new one)."""
        from engine.bundle import read_bundle as read

        convs, entries = read(Path(path))
        store = self.backend.conversations
        skipped = copied = 0
        if duplicates is not None:
            policy = DuplicatePolicy(duplicates)  # ValueError for a policy that does not exist, before any lookup
            found = find_duplicates(store, convs)
            convs = apply_duplicates(convs, found, policy)
            skipped, copied = (len(found), 0) if policy is DuplicatePolicy.SKIP else (0, len(found))
        ids = store.insert_full(convs)
        owners = {c["id"]: new for c, new in zip(convs, ids, strict=True) if c["id"]}
        result = self.import_bundle_contexts(Path(path), entries, owners, trust)
        return dataclasses.replace(result, conversations={new: c["id"] or "" for c, new in zip(convs, ids, strict=True)},
                                   skipped=skipped, copied=copied)

    def _local_identity(self):
        """(What a checkpoint must match here, the vocabulary size): from the loaded model, else read from
        the model's GGUF without starting ONNX Runtime; (None, None) when there is no model."""
        sessions = self.backend.sessions
        if sessions is not None:
            return sessions.identity, sessions.engine.tokenizer.vocab_size
        from engine.checkpoint.identity import gguf_identity
        from engine.loader import resolve_gguf

        try:
            return gguf_identity(resolve_gguf(self.backend.paths, self.backend.model_path), self.backend.weights)
        except HearthError as exc:
            log.info("no model to check bundle contexts against: %s", exc)
            return None, None
