"""The model library: every model Hearth knows, what each is, whether it can run, and what it needs.

Four kinds of models (``LibraryModel.source``):

* **catalog**: ``resources/models.json`` (fetched by Hearth; listed with their pinned facts before a download);
* **added**: a GGUF the user added by path. It is linked where it is (never copied unless asked: then
  it is copied atomically into the models dir, and that copy is Hearth's). Removing it only forgets it;
  a copy Hearth made is deleted;
* **hub**: a GGUF engine/hub.py downloaded from the Hugging Face Hub into the models dir (kept with the
  added files, ``"origin": "hub"``; it is Hearth's, so removing it deletes it);
* **folder**: the ``.gguf`` files in the models folder the user chose, and in its subfolders one level
  down, found each time the library is listed. They cannot be removed here: a folder model belongs to
  the folder (``remove`` refuses and says to move the file or clear the folder).

Names are the catalog keys and, for files, a slug of the file's stem; two files with one stem get
``foo`` and ``foo-2``, and a name once given stays with its file (kept in the state file).

State lives in ``<data>/library.json`` (written atomically, private, under an inter-process lock): the
added files, the names given to folder files, the folder, the model ``use`` chose and the context
length set per model. It is read as untrusted: a file that is damaged, foreign or of another version is
logged, set aside as ``library.json.bad`` and the library starts again from the catalog.

Reading a file's facts parses its header only, cached per (path, size, mtime) (engine/model/facts.py);
listing never hashes a large file. Memory figures are engine/model/memory.py's.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from engine.errors import (
    HearthError,
    ModelFetchError,
    ModelFileError,
    ModelNotFoundError,
    ModelNotInstalledError,
    UnsupportedModelError,
)
from engine.file_lock import StoreLock
from engine.fsutil import atomic_write, open_regular
from engine.model import memory
from engine.model.facts import FactsCache, FileFacts
from engine.model.fetch import Cancel, ModelEntry, ProgressFn, fetch_model, installed_path, load_manifest, remove_downloads
from engine.model.precision import DEFAULT_PRECISION, cuda_variant, get_precision
from engine.paths import HearthPaths, bundled_model_dir
from engine.private_files import FILE_MODE, private_dir
from engine.types import LibraryModel, MemoryFit, ModelOrigin, ModelStatus

log = logging.getLogger(__name__)

STATE_FILE = "library.json"
FACTS_FILE = "model-facts.json"
STATE_VERSION = 1
MAX_STATE_BYTES = 4 << 20
MAX_ADDED = 1000
MAX_FOLDER_FILES = 1000  # a folder holding more .gguf files lists the first ones, by path
MAX_PATH_CHARS = 4096
MIN_CONTEXT = 16  # as Engine.set_context_limit
LOCK_WAIT_S = 10.0
MAX_CONTEXT = 1 << 24
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,79}$")


class LibraryBusyError(HearthError):
    """Another Hearth process held the library's state for too long."""


class _LibraryLock(StoreLock):
    def busy_error(self) -> HearthError:
        return LibraryBusyError(f"the model library in {self.path.parent} is busy in another Hearth process; try again")


@dataclass(frozen=True)
class _Item:
    """A model before its file is read: where it comes from and where its file is (or would be)."""

    name: str
    source: ModelOrigin
    path: Path | None  # None: a catalog model that is not downloaded
    entry: ModelEntry | None = None  # catalog models
    copied: bool = False  # an added file Hearth copied into the models dir


def slug(stem: str) -> str:
    """A file stem as a library name: lower case, letters, digits, ``.``, ``_`` and ``-``."""
    text = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).strip("-._")
    return (text[:64].rstrip("-._") or "model") if text else "model"


class ModelLibrary:
    """The model library of one data dir. Cheap to make; every call reads the state afresh, so the
    window and ``hearth-cli`` see each other's changes. ``weights``: the precision memory figures and
    ``converted`` are for. ``available_bytes``: the free memory to plan with (None: measured each time)."""

    def __init__(self, paths: HearthPaths, *, weights: str = DEFAULT_PRECISION, available_bytes: int | None = None):
        self.paths = paths
        self.weights = get_precision(weights).name
        self.available_bytes = available_bytes
        self.state_file = paths.data / STATE_FILE

    # listing --------------------------------------------------------------------------------------------------
    def models(self) -> list[LibraryModel]:
        """Every model: the catalog's, then the added files, then the folder's."""
        state = self._read()
        items = self._items(state)
        cache = self._facts_cache()
        try:
            available = self._available()
            return [self._describe(item, state, cache, available) for item in items]
        finally:
            cache.save()

    def get(self, name: str) -> LibraryModel:
        """One model by name; ModelNotFoundError listing the known names."""
        state = self._read()
        item = self._find(state, name)
        cache = self._facts_cache()
        try:
            return self._describe(item, state, cache, self._available())
        finally:
            cache.save()

    def default_name(self) -> str:
        """What Hearth loads when no model is named: the model ``use`` chose, else the catalog's default."""
        chosen = self._read().get("default")
        return chosen if isinstance(chosen, str) else load_manifest()[0]

    @property
    def folder(self) -> Path | None:
        folder = self._read().get("folder")
        return Path(folder) if folder else None

    def folder_problem(self) -> str:
        """Why the models folder lists nothing, in plain words ("" when it is there or none is set)."""
        folder = self.folder
        if folder is None:
            return ""
        try:
            with os.scandir(folder):
                return ""
        except FileNotFoundError:
            return f"the models folder {folder} is not there (was it moved, or is its drive not mounted?)"
        except NotADirectoryError:
            return f"the models folder {folder} is a file, not a folder"
        except OSError as exc:
            return f"the models folder {folder} cannot be read ({exc.strerror or exc})"

    # loading --------------------------------------------------------------------------------------------------
    def gguf_path(self, name: str) -> Path:
        """The file to load for ``name``, or the error that says why it cannot be loaded: not downloaded
        (ModelNotInstalledError), gone or unreadable (ModelFileError), unsupported (UnsupportedModelError)."""
        model = self.get(name)
        if model.status == ModelStatus.READY:
            return Path(model.path)
        if model.status == ModelStatus.NOT_DOWNLOADED:
            raise ModelNotInstalledError(f"{model.title} is not installed in {self.paths.models}; "
                                         f"run 'hearth-cli model fetch {model.name}' first")
        if model.status == ModelStatus.UNSUPPORTED:
            raise UnsupportedModelError(model.problem)
        raise ModelFileError(model.problem)

    def describe_file(self, path: Path) -> LibraryModel:
        """A file as the library would show it: its entry when it is in the library, else an entry made
        for it alone (source "added", not stored)."""
        path = Path(path).expanduser().resolve()
        state = self._read()
        item = next((i for i in self._items(state) if i.path is not None and _same_file(i.path, path)), None)
        cache = self._facts_cache()
        try:
            return self._describe(item or _Item(slug(path.stem), ModelOrigin.ADDED, path), state, cache, self._available())
        finally:
            if item is not None:  # a file outside the library leaves no trace
                cache.save()

    def context_for(self, model: LibraryModel) -> int | None:
        """The context length loading ``model`` uses (None: the model's own, which is unknown here)."""
        return model.chosen_context or None

    def memory_fit(self, name: str, context: int | None = None, *, available_bytes: int | None = None,
                   provider: str = "cpu") -> MemoryFit:
        """Whether ``name`` (a library name or a GGUF path) at ``context`` tokens (None: its chosen context)
        fits the free memory: RAM, or the GPU's when ``provider`` runs it on CUDA. ``available_bytes``
        overrides the measurement (tests, or a caller that knows better)."""
        model = self.describe_file(Path(name)) if Path(name).expanduser().is_file() else self.get(name)
        return self.fit(model, context, available_bytes=available_bytes, provider=provider)

    def fit(self, model: LibraryModel, context: int | None = None, *, available_bytes: int | None = None,
            provider: str = "cpu") -> MemoryFit:
        """memory_fit for a model already described."""
        context = context or model.chosen_context or model.context_length
        context = min(context, model.context_length) if model.context_length else context
        weights = model.ram_weights_bytes
        kv = memory.context_bytes(model.ram_resident_bytes, weights, model.kv_bytes_per_token, context)
        override = self.available_bytes if available_bytes is None else available_bytes
        where, available = "RAM", memory.available_ram() if override is None else override
        gpu = None if override is not None else _gpu_plan(model, provider, self.weights, context)
        if gpu is not None:
            weights, kv, available = gpu
            where = "GPU memory"
        needed = weights + kv  # memory.needed_bytes, the sum the automatic context was picked to fit
        return MemoryFit(model.title, context, weights, kv, available or 0, where, memory.fits(needed, available),
                         memory.fit_message(model.title, weights, kv, context, available, where))

    def fetch(self, name: str, progress: ProgressFn | None = None, cancel: Cancel = None, *,
              index: str | None = None, force: bool = False) -> Path:
        """Download a catalog model (engine/model/fetch.py: resumable, verified, cancellable)."""
        item = self._find(self._read(), name)
        if item.entry is None:
            raise ModelFetchError(f"{name} is not a catalog model, so there is nothing to download")
        return fetch_model(item.entry, self.paths.models, index=index, progress=progress, force=force, cancel=cancel)

    # changes --------------------------------------------------------------------------------------------------
    def add(self, path: str | Path, copy: bool = False, *, progress: ProgressFn | None = None,
            origin: ModelOrigin = ModelOrigin.ADDED) -> LibraryModel:
        """Add a GGUF by path: linked where it is, or (``copy``) copied into the models dir. Adding a file
        the library has already returns its entry. A file that is not a GGUF is refused (ModelFileError).
        ``origin`` HUB: a file engine/hub.py downloaded into the models dir, Hearth's (removing it deletes it)."""
        if origin not in (ModelOrigin.ADDED, ModelOrigin.HUB):
            raise ValueError(f"a model is added by path or from the hub, not as {origin}")
        source = Path(path).expanduser()
        if source.is_dir():
            raise ModelFileError(f"{source} is a folder; to list every GGUF in it, run 'hearth-cli model folder {source}'")
        if not source.is_file():
            raise ModelFileError(f"no such file: {source}")
        source = source.resolve()
        known = next((i for i in self._items(self._read()) if i.path is not None and i.source != ModelOrigin.FOLDER
                      and _same_file(i.path, source)), None)
        if known is not None:
            return self.get(known.name)
        facts = self._facts_cache().facts(source, self.weights)
        if facts.status == "unreadable":
            raise ModelFileError(facts.problem)
        stored = self._copy_in(source, progress) if copy else source
        with self._lock.held():
            state = self._read()
            if len(state["added"]) >= MAX_ADDED:
                raise ModelFileError(f"the library holds {MAX_ADDED} added models already; remove some first")
            name = self._free_name(state, slug(source.stem))
            entry = {"name": name, "path": str(stored), "copied": copy or origin == ModelOrigin.HUB}
            if origin == ModelOrigin.HUB:
                entry["origin"] = str(ModelOrigin.HUB)
            state["added"].append(entry)
            state["folder_names"] = {k: v for k, v in state["folder_names"].items() if not _same_file(Path(k), stored)}
            self._write(state)
        return self.get(name)

    def remove(self, name: str) -> None:
        """Take a model out: an added file is forgotten (a copy Hearth made is deleted, the user's own file
        never); a catalog model's downloaded file and conversions are deleted (it stays listed, not
        downloaded); a folder model is refused (it belongs to the folder)."""
        state = self._read()
        item = self._find(state, name)
        if item.source == ModelOrigin.FOLDER:
            raise ModelFileError(f"{name} is a file in the models folder {state['folder']}; move or delete it there, "
                                 "or stop using the folder with 'hearth-cli model folder --clear'")
        if item.source == ModelOrigin.CATALOG:
            self._delete_download(item)
        elif item.copied and item.path is not None:
            self._delete_conversions(item.path)
            _unlink_model_file(item.path)
        with self._lock.held():  # a removed model is no longer the one loaded by default
            state = self._read()
            state["added"] = [a for a in state["added"] if a["name"] != name]
            if item.source != ModelOrigin.CATALOG:
                state["contexts"].pop(name, None)
            if state.get("default") == name:
                state["default"] = None
            self._write(state)

    def use(self, name: str) -> LibraryModel:
        """Make ``name`` the model Hearth loads when none is named (the window, ``hearth-cli generate``...).
        A catalog model may be chosen before it is downloaded; a file that cannot load is refused."""
        model = self.get(name)
        if model.status in (ModelStatus.MISSING, ModelStatus.UNREADABLE, ModelStatus.UNSUPPORTED):
            raise (UnsupportedModelError if model.status == ModelStatus.UNSUPPORTED else ModelFileError)(
                f"{name} cannot be used: {model.problem}")
        with self._lock.held():
            state = self._read()
            state["default"] = None if name == load_manifest()[0] else name
            self._write(state)
        return replace(model, is_default=True)

    def set_context(self, name: str, tokens: int | None) -> LibraryModel:
        """Set the context length ``name`` loads with (None: automatic, the model's own capped to fit memory)."""
        model = self.get(name)
        if tokens is not None:
            if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < MIN_CONTEXT:
                raise HearthError(f"a context length must be a whole number of at least {MIN_CONTEXT} tokens, got {tokens!r}")
            if model.context_length and tokens > model.context_length:
                raise HearthError(f"{model.title} reads at most {model.context_length:,} tokens of context; "
                                  f"choose {model.context_length} or less")
        with self._lock.held():
            state = self._read()
            state["contexts"].pop(name, None)
            if tokens is not None:
                state["contexts"][name] = tokens
            self._write(state)
        return self.get(name)

    def set_folder(self, folder: str | Path | None) -> Path | None:
        """Use ``folder``'s ``.gguf`` files (and its subfolders', one level down), or none (None)."""
        path = None
        if folder is not None:
            path = Path(folder).expanduser()
            if not path.is_dir():
                raise ModelFileError(f"no such folder: {path}")
            path = path.resolve()
        with self._lock.held():
            state = self._read()
            for gone in state["folder_names"].values():  # the old folder's models: a choice of one goes with it
                state["contexts"].pop(gone, None)
                if state.get("default") == gone:
                    state["default"] = None
            state["folder"], state["folder_names"] = (str(path) if path else None), {}
            self._write(state)
        return path

    # items and names ------------------------------------------------------------------------------------------
    def _items(self, state: dict) -> list[_Item]:
        default, entries = load_manifest()
        items = [_Item(key, ModelOrigin.CATALOG, self._catalog_file(entry, key == default), entry)
                 for key, entry in entries.items()]
        items += [_Item(a["name"], ModelOrigin(a.get("origin", ModelOrigin.ADDED)), Path(a["path"]), copied=a["copied"])
                  for a in state["added"]]
        taken = [i.path for i in items if i.path is not None]
        files = [f for f in self._folder_files(state) if not any(_same_file(f, t) for t in taken)]
        missing = [f for f in files if str(f) not in state["folder_names"]]
        if missing:  # new files: name them once, for good
            with self._lock.held():
                state.update(self._read())
                for f in missing:
                    if str(f) not in state["folder_names"]:
                        state["folder_names"][str(f)] = self._free_name(state, slug(f.stem))
                state["folder_names"] = {k: v for k, v in state["folder_names"].items() if Path(k).exists()}
                self._write(state)
        return items + [_Item(state["folder_names"][str(f)], ModelOrigin.FOLDER, f) for f in files
                        if str(f) in state["folder_names"]]

    def _find(self, state: dict, name: str) -> _Item:
        items = self._items(state)
        for item in items:
            if item.name == name:
                return item
        raise ModelNotFoundError(f"no model called {name!r} in the library (known: {', '.join(i.name for i in items)}); "
                                 "add a GGUF file with 'hearth-cli model add PATH'")

    def _free_name(self, state: dict, base: str) -> str:
        taken = set(load_manifest()[1]) | {a["name"] for a in state["added"]} | set(state["folder_names"].values())
        name, n = base, 2
        while name in taken:
            name = f"{base[:60]}-{n}"
            n += 1
        return name

    def _folder_files(self, state: dict) -> list[Path]:
        folder = state.get("folder")
        if not folder:
            return []
        found: list[Path] = []
        try:
            for top in sorted(Path(folder).iterdir()):
                try:
                    subs = sorted(top.iterdir()) if top.is_dir() and not top.name.startswith(".") else [top]
                except OSError as exc:  # one unreadable subfolder does not hide the others' models
                    log.info("cannot list %s: %s", top, exc)
                    continue
                found += [p for p in subs if p.suffix.lower() == ".gguf" and not p.name.startswith(".") and _is_file(p)]
                if len(found) >= MAX_FOLDER_FILES:
                    log.warning("the models folder %s holds more than %d GGUF files; listing the first", folder,
                                MAX_FOLDER_FILES)
                    break
        except OSError as exc:
            log.info("cannot list the models folder %s: %s", folder, exc)
        return found[:MAX_FOLDER_FILES]

    def _catalog_file(self, entry: ModelEntry, is_default: bool) -> Path | None:
        installed = installed_path(entry, self.paths.models)
        if _is_file(installed):  # an unreadable models dir raises on a plain is_file()
            return installed
        if is_default:  # a packaged build ships the default model read-only
            try:
                bundled = bundled_model_dir()
            except ModelFileError:
                return None
            if bundled is not None and _is_file(installed_path(entry, bundled / "models")):
                return installed_path(entry, bundled / "models")
        return None

    # describing -----------------------------------------------------------------------------------------------
    def _describe(self, item: _Item, state: dict, cache: FactsCache, available: int | None) -> LibraryModel:
        entry = item.entry
        setting = state["contexts"].get(item.name)
        base = LibraryModel(
            name=item.name, title=entry.title if entry else item.path.stem, source=item.source,
            path=str(item.path) if item.path else None, status=ModelStatus.NOT_DOWNLOADED,
            architecture=entry.architecture if entry else "", parameters=entry.parameters if entry else "",
            quant=entry.quant if entry else "", file_bytes=entry.size if entry else 0,
            context_length=entry.context_length if entry else 0, context_setting=setting,
            description=entry.description if entry else "", license=entry.license if entry else "",
            defaults=dict(entry.defaults) if entry else {},
            is_default=item.name == (state.get("default") or load_manifest()[0]))
        if item.path is None:  # a catalog model not downloaded: what the catalog pins
            per_token = _kv_per_token(entry.kv_bytes_per_token, self.weights)
            pinned = get_precision(self.weights).weights_id == "int4"  # the pins are for int4 weights
            weights = memory.WeightsMemory(entry.int4_resident_bytes if pinned else 0, 0)
            return self._with_memory(base, weights.resident_bytes, entry.int4_load_bytes if pinned else 0, per_token,
                                     available)
        try:
            size = item.path.stat().st_size
        except OSError:
            return replace(base, status=ModelStatus.MISSING, problem=f"the file {item.path} is gone — was it moved? "
                           f"Add it again, or remove it with 'hearth-cli model rm {item.name}'")
        facts = cache.facts(item.path, self.weights)
        base = replace(base, file_bytes=size, title=entry.title if entry else (facts.title or item.path.stem))
        base = _with_facts(base, facts)
        if facts.status != "ready":
            return base
        digest = cache.digest(item.path, entry.gguf_sha256 if entry and size == (entry.size or size) else None)
        conversion = self._conversion(item.path, digest)
        weights = memory.WeightsMemory(facts.weights_bytes, facts.transient_bytes)
        if conversion is not None:
            weights = cache.conversion_memory(conversion) or weights
        return self._with_memory(replace(base, converted=conversion is not None), weights.resident_bytes,
                                 weights.peak_bytes, facts.kv_bytes_per_token, available)

    def _with_memory(self, model: LibraryModel, resident: int, peak: int, kv_per_token: int,
                     available: int | None) -> LibraryModel:
        own = model.context_length
        if model.context_setting is not None:
            chosen = min(model.context_setting, own) if own else model.context_setting
        else:
            chosen = memory.auto_context(own, resident, kv_per_token, available, peak or None)
        return replace(model, chosen_context=chosen, ram_weights_bytes=peak, ram_resident_bytes=resident,
                       kv_bytes_per_token=kv_per_token,
                       ram_kv_bytes=memory.context_bytes(resident, peak, kv_per_token, chosen) if peak else 0)

    def _conversion(self, gguf: Path, digest: str | None) -> Path | None:
        """The conversion at the library's precision, when one is complete (the data dir's, or a packaged build's)."""
        from engine.model.convert import cached_conversion, conversion_dir

        if digest is None:
            return None
        roots = [self.paths.converted]
        try:
            bundled = bundled_model_dir()
        except ModelFileError:
            bundled = None
        if bundled is not None:
            roots.append(bundled / "converted")
        for root in roots:
            done = cached_conversion(conversion_dir(root, digest, self.weights), gguf, digest, self.weights)
            if done is not None and done.onnx_path.is_file():
                return done.onnx_path
        return None

    def _available(self) -> int | None:
        return memory.available_ram() if self.available_bytes is None else self.available_bytes

    def _facts_cache(self) -> FactsCache:
        # Beside the models and conversions: the cache dir (the data dir under HEARTH_HOME).
        return FactsCache(self.paths.models.parent / FACTS_FILE)

    # deleting ---------------------------------------------------------------------------------------------------
    def _delete_download(self, item: _Item) -> None:
        target = installed_path(item.entry, self.paths.models)
        remove_downloads(item.entry, self.paths.models)
        if not target.is_file():
            if item.path is not None:  # the packaged build's copy: read-only, not Hearth's to delete
                raise ModelFileError(f"{item.entry.title} comes with this build ({item.path}); it cannot be removed")
            raise ModelFileError(f"{item.entry.title} is not downloaded; there is nothing to remove")
        self._delete_conversions(target, item.entry.gguf_sha256)
        _unlink_model_file(target)

    def _delete_conversions(self, gguf: Path, pinned: str | None = None) -> None:
        """Delete the data dir's conversions of ``gguf`` (every precision), unless another model in the
        library is the same file content."""
        from engine.model.convert import CONVERTER_VERSION

        cache = self._facts_cache()
        others = [i.path for i in self._items(self._read()) if i.path is not None and not _same_file(i.path, gguf)]
        try:
            digests = {d for d in (pinned, cache.digest(gguf)) if d}
            shared = {cache.digest(p) for p in others}  # large files only by a hash already known
        finally:
            cache.save()
        for digest in digests - shared:
            for folder in self.paths.converted.glob(f"{digest[:16]}-c{CONVERTER_VERSION}-*"):
                shutil.rmtree(folder, ignore_errors=True)

    # the state file -------------------------------------------------------------------------------------------
    @property
    def _lock(self) -> _LibraryLock:
        private_dir(self.paths.data)
        return _LibraryLock(self.paths.data / "library.lock", timeout_s=LOCK_WAIT_S)

    def _read(self) -> dict:
        """The state, validated; a damaged or foreign file is set aside and the library starts afresh."""
        fresh = {"version": STATE_VERSION, "default": None, "folder": None, "added": [], "folder_names": {}, "contexts": {}}
        try:
            with open_regular(self.state_file) as fh:  # a FIFO would hang the read
                raw = fh.read(MAX_STATE_BYTES + 1)
            if len(raw) > MAX_STATE_BYTES:
                raise ValueError(f"it is larger than {MAX_STATE_BYTES >> 20} MiB")
        except FileNotFoundError:
            return fresh
        except (OSError, ValueError) as exc:
            return self._set_aside(fresh, exc)
        try:
            return _validated(json.loads(raw.decode("utf-8")))
        except (ValueError, UnicodeDecodeError, TypeError, KeyError, RecursionError) as exc:  # Recursion: 100k '['
            return self._set_aside(fresh, exc)

    def _set_aside(self, fresh: dict, why: Exception) -> dict:
        bad = self.state_file.with_name(STATE_FILE + ".bad")
        log.warning("the model library %s cannot be used (%s); it is kept as %s and the library starts from the catalog",
                    self.state_file, why, bad.name)
        try:
            os.replace(self.state_file, bad)
        except OSError as exc:
            log.warning("cannot set %s aside: %s", self.state_file, exc)
        return fresh

    def _write(self, state: dict) -> None:
        private_dir(self.paths.data)
        with atomic_write(self.state_file) as fh:  # mkstemp: 0600
            fh.write(json.dumps(state, indent=1, ensure_ascii=False).encode("utf-8"))

    # copying --------------------------------------------------------------------------------------------------
    def _copy_in(self, source: Path, progress: ProgressFn | None) -> Path:
        """An atomic copy of ``source`` in the models dir (a free file name there)."""
        models = self.paths.models
        try:
            private_dir(models)
            size = source.stat().st_size  # a full disk fails the write: atomic_write leaves nothing behind
            target, n = models / source.name, 2
            while target.exists():
                target = models / f"{source.stem}-{n}{source.suffix}"
                n += 1
            done = 0
            with open(source, "rb") as src, atomic_write(target) as out:
                while block := src.read(1 << 20):
                    out.write(block)
                    done += len(block)
                    if progress:
                        progress(done, size)
        except OSError as exc:
            raise ModelFileError(f"could not copy {source.name} into {models}: {exc.strerror or exc}") from None
        os.chmod(target, FILE_MODE)
        return target


def chosen_model(paths: HearthPaths) -> str | None:
    """The model ``use`` chose, when it is not the catalog's default (None: load the default as before)."""
    return ModelLibrary(paths)._read().get("default")


def _validated(data) -> dict:
    """The state with every field checked (ValueError / TypeError / KeyError naming what is wrong)."""
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        raise ValueError("not a Hearth model library of this version")
    default, folder = data.get("default"), data.get("folder")
    if default is not None and not (isinstance(default, str) and _NAME.match(default)):
        raise ValueError("bad default model")
    if folder is not None and not (isinstance(folder, str) and 0 < len(folder) <= MAX_PATH_CHARS):
        raise ValueError("bad folder")
    added = data["added"]
    if not isinstance(added, list) or len(added) > MAX_ADDED:
        raise ValueError("bad added models")
    for a in added:
        if not (isinstance(a, dict) and isinstance(a.get("name"), str) and _NAME.match(a["name"])
                and isinstance(a.get("path"), str) and 0 < len(a["path"]) <= MAX_PATH_CHARS
                and os.path.isabs(a["path"]) and isinstance(a.get("copied"), bool)
                and a.get("origin", "added") in ("added", "hub")):
            raise ValueError("bad added model entry")
    names = data["folder_names"]
    if not isinstance(names, dict) or len(names) > MAX_FOLDER_FILES * 2:
        raise ValueError("bad folder names")
    if not all(isinstance(k, str) and len(k) <= MAX_PATH_CHARS and isinstance(v, str) and _NAME.match(v)
               for k, v in names.items()):
        raise ValueError("bad folder name entry")
    contexts = data["contexts"]
    if not isinstance(contexts, dict) or len(contexts) > MAX_ADDED + MAX_FOLDER_FILES * 2 + 64:
        raise ValueError("bad context settings")
    if not all(isinstance(k, str) and type(v) is int and MIN_CONTEXT <= v <= MAX_CONTEXT for k, v in contexts.items()):
        raise ValueError("bad context setting")
    every = [a["name"] for a in added] + list(names.values())
    if len(set(every)) != len(every):
        raise ValueError("two models share a name")
    return {"version": STATE_VERSION, "default": default, "folder": folder,
            "added": [{"name": a["name"], "path": a["path"], "copied": a["copied"],
                       **({"origin": a["origin"]} if a.get("origin", "added") != "added" else {})} for a in added],
            "folder_names": dict(names), "contexts": dict(contexts)}


def _with_facts(model: LibraryModel, facts: FileFacts) -> LibraryModel:
    status = {"ready": ModelStatus.READY, "unsupported": ModelStatus.UNSUPPORTED}.get(facts.status, ModelStatus.UNREADABLE)
    return replace(model, status=status, problem=facts.problem,
                   architecture=facts.architecture or model.architecture, parameters=facts.parameters or model.parameters,
                   parameter_count=facts.parameter_count, quant=facts.quant or model.quant, quant_mix=dict(facts.quant_mix),
                   context_length=facts.context_length or model.context_length)


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False where it cannot be looked at (pathlib raises PermissionError)."""
    try:
        return path.is_file()
    except OSError:
        return False


def _kv_per_token(fp32_bytes: int, weights: str) -> int:
    return fp32_bytes // 2 if get_precision(weights).compute == "float16" else fp32_bytes


def _gpu_plan(model: LibraryModel, provider: str, weights: str, context: int) -> tuple[int, int, int] | None:
    """(weights, KV, free GPU memory) when ``provider`` would run ``model`` on CUDA, else None (RAM)."""
    if provider == "cpu" or model.path is None or model.status != ModelStatus.READY:
        return None
    free = memory.free_gpu_memory()
    if free is None:
        return None
    from engine.arch import architecture_for, fp16_activations_ok, model_config
    from engine.model.footprint import model_footprint, rotary_table_bytes
    from engine.model.gguf_file import GGUFModel
    from engine.runtime import providers

    if providers.cuda_unavailable():
        return None
    gguf = GGUFModel(model.path)
    if not fp16_activations_ok(architecture_for(gguf)):
        return None  # such a model runs on the CPU
    variant = cuda_variant(weights, Path(model.path)) or weights
    footprint = model_footprint(gguf, variant)
    per_token = footprint.kv_cache_bytes // footprint.context_length if footprint.context_length else 0
    # The rotary tables load with the weights, as the RAM estimate (engine/model/facts.py) counts them.
    return footprint.weights_bytes + rotary_table_bytes(model_config(gguf), variant), per_token * context, free


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a == b or os.path.samefile(a, b)
    except OSError:
        return False


def _unlink_model_file(path: Path) -> None:
    for p in (path, path.with_name(path.name + ".sha256.json")):
        p.unlink(missing_ok=True)
