"""GGUF models from the Hugging Face Hub, through ``huggingface_hub`` (the hub's own client): search GGUF
repositories, list a repository's GGUF files (a split GGUF as one, with its quantization, size and a memory
estimate), download one (progress with speed, Cancel, resume, checked against the hub's SHA-256) and add it
to the model library.

Listings come from ``HfApi.model_info`` and, for a search, ``list_models``' request made through the
client's session (``HubClient._list_models`` says why). The hub's address is ``HF_ENDPOINT``, read at each
call (``huggingface_hub`` reads it once, at import, so the endpoint is passed to ``HfApi`` and used to build
the search and download URLs explicitly). The token, for gated repositories, is kept in
engine/secret_store.py's store (kind "hub", name "huggingface"), never the hub client's own
``~/.cache/huggingface/token``: with no token stored, ``token=False`` sends none (the client would otherwise
pick up HF_TOKEN or that file). Nothing is written under ``~/.cache/huggingface``: the metadata calls cache
nothing, and the bytes go through Hearth's own loop (engine/hub_download.py says why).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from engine.errors import (
    DownloadCancelledError,
    HubChecksumError,
    HubError,
    HubGatedError,
    HubNotFoundError,
    HubOfflineError,
)
from engine.fsutil import fsync_dir
from engine.hub_download import download_blob, gated_message, matches
from engine.hub_files import (
    MAX_SIBLINGS,
    HubFile,
    HubProgress,
    HubRepo,
    RemoteBlob,
    check_filename,
    check_repo_id,
    gguf_files,
    local_name,
    merged_name,
)
from engine.model.fetch import DOWNLOADS_DIR, cancelled
from engine.model.memory import size_words
from engine.paths import HearthPaths
from engine.private_files import private_dir
from engine.secret_store import SecretStore, check_secret
from engine.types import CancelToken, LibraryModel, ModelOrigin

log = logging.getLogger(__name__)

__all__ = ["HubClient", "HubFile", "HubProgress", "HubRepo", "parse_hub_ref", "HubError", "HubOfflineError",
           "HubGatedError", "HubNotFoundError", "HubChecksumError", "DownloadCancelledError"]

DEFAULT_ENDPOINT = "https://huggingface.co"
TOKEN_KIND, TOKEN_NAME = "hub", "huggingface"
MAX_SEARCH_RESULTS = 100
MAX_QUERY_CHARS = 200
API_TIMEOUT_S = 20.0  # a listing's answer (the download's own timeouts are engine/hub_download.py's)
CONNECT_TIMEOUT_S = 15.0
DISK_MARGIN_BYTES = 64 << 20
MAX_LISTING_BYTES = 16 << 20  # 100 repositories' entries are ~100 KB
HubProgressFn = Callable[[HubProgress], None]


def endpoint_now() -> str:
    """The hub's address as HF_ENDPOINT says now (the tests point it at a local server per test)."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).strip().rstrip("/")


def parse_hub_ref(ref: str) -> tuple[str, str]:
    """``hf:OWNER/REPO/FILE.gguf`` (the file may sit in folders) → (repo, filename); HubError otherwise."""
    text = ref.strip()
    if not text.startswith("hf:"):
        raise HubError(f"{text[:100]!r} is not a hub model: write it as hf:OWNER/REPO/FILE.gguf")
    pieces = text[3:].split("/", 2)
    if len(pieces) < 3 or not pieces[2].lower().endswith(".gguf"):
        raise HubError(f"{text[:100]!r} names no GGUF file: write it as hf:OWNER/REPO/FILE.gguf "
                       "(see 'hearth-cli model files OWNER/REPO')")
    return check_repo_id("/".join(pieces[:2])), check_filename(pieces[2])


class HubClient:
    """The hub for one data dir: search, list, download, install; the token for gated repositories."""

    def __init__(self, paths: HearthPaths, *, endpoint: str | None = None, secrets: SecretStore | None = None):
        self.paths = paths
        self._endpoint = endpoint.rstrip("/") if endpoint else None
        self.secrets = secrets or SecretStore(paths.data)

    @property
    def endpoint(self) -> str:
        return self._endpoint or endpoint_now()

    # the token ----------------------------------------------------------------------------------------------
    def set_token(self, token: str) -> None:
        self.secrets.set(TOKEN_KIND, TOKEN_NAME, check_secret(token, "the Hugging Face token"))

    def clear_token(self) -> None:
        self.secrets.delete(TOKEN_KIND, TOKEN_NAME)

    def has_token(self) -> bool:
        return self.secrets.get(TOKEN_KIND, TOKEN_NAME) is not None

    def _token(self) -> str | bool:
        return self.secrets.get(TOKEN_KIND, TOKEN_NAME) or False  # False: send none, never the client's own

    # listing ------------------------------------------------------------------------------------------------
    def search(self, query: str, limit: int = 20) -> list[HubRepo]:
        """GGUF repositories whose name matches ``query``, most downloaded first (at most 100)."""
        query = query.strip()
        if not query:
            raise HubError("say what to search for: a model's name, e.g. 'SmolLM2'")
        if len(query) > MAX_QUERY_CHARS or not query.isprintable():
            raise HubError(f"a search is at most {MAX_QUERY_CHARS} printable characters")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise HubError(f"the number of results must be a whole number of at least 1, got {limit!r}")
        limit = min(limit, MAX_SEARCH_RESULTS)
        found = self._call(lambda: self._list_models(query, limit), f"searching for {query!r}")
        return [_repo(m) for m in found[:limit]]

    def _list_models(self, query: str, limit: int) -> list:
        """``HfApi.list_models(search=, filter="gguf", sort="downloads", limit=, expand=)``'s one request,
        made here: list_models sends it through http_backoff, which retries a refused connection or a 5xx
        five times with waits (about 20 s before "no network" could be said), with no timeout. The same
        session, headers, error codes (hf_raise_for_status) and ModelInfo parsing as list_models; a limit of
        at most 100 is one page."""
        _quiet_client()
        from huggingface_hub.hf_api import ModelInfo
        from huggingface_hub.utils import get_session, hf_raise_for_status

        params = {"search": query, "filter": ["gguf"], "sort": "downloads", "limit": limit,
                  "expand": ["downloads", "likes", "gated", "lastModified"]}
        r = get_session().get(f"{self.endpoint}/api/models", params=params, headers=self._headers(),
                              timeout=API_TIMEOUT_S)
        hf_raise_for_status(r)
        if len(r.content) > MAX_LISTING_BYTES:
            raise ValueError("the search answer is too large")
        items = r.json()
        if not isinstance(items, list):
            raise TypeError("the search answer is not a list")
        return [ModelInfo(**{"siblings": None, **item}) for item in items[:limit] if isinstance(item, dict)]

    def files(self, repo: str) -> list[HubFile]:
        """The repository's GGUF models (a split one as one HubFile), by file name."""
        repo = check_repo_id(repo)
        return gguf_files(repo, self._blobs(repo)[0])

    def _blobs(self, repo: str) -> tuple[list[RemoteBlob], str]:
        """The repository's files with sizes and hashes, and the commit they are of ("main" when unsaid)."""
        api = self._api()
        info = self._call(lambda: api.model_info(repo, files_metadata=True, timeout=API_TIMEOUT_S), repo, repo)
        blobs = []
        for s in (info.siblings or [])[:MAX_SIBLINGS]:
            try:
                name = check_filename(s.rfilename)
            except HubError:
                log.info("skipping a file with an odd name in %s", repo)
                continue
            size = s.lfs.size if s.lfs is not None else s.size
            if not isinstance(size, int) or size < 0 or size > 1 << 40:
                continue  # the hub did not say how big: it cannot be checked or planned for
            blobs.append(RemoteBlob(name, size, _hex(s.lfs.sha256, 64) if s.lfs is not None else None,
                                    _hex(s.blob_id, 40) if s.lfs is None else None))
        return blobs, _hex(info.sha, 40) or "main"

    # downloading --------------------------------------------------------------------------------------------
    def file(self, repo: str, filename: str) -> HubFile:
        """The HubFile for ``filename`` in ``repo`` (any part of a split GGUF names all of it)."""
        repo, filename = check_repo_id(repo), check_filename(filename)
        for f in self.files(repo):
            if filename in f.parts:
                return f
        raise HubNotFoundError(f"{repo} has no GGUF called {filename}; see 'hearth-cli model files {repo}'")

    def download(self, file: HubFile, progress: HubProgressFn | None = None,
                 cancel: CancelToken | None = None) -> Path:
        """Download ``file`` (all its parts, each checked against the hub's hash), and return the one GGUF
        in the models dir: a split GGUF joined into one. A failure or a cancel keeps what was downloaded
        (``<models>/.downloads``) and the next call resumes it."""
        listed, commit = self._blobs(file.repo)
        blobs = {b.filename: b for b in listed}
        missing = [p for p in file.parts if p not in blobs]
        if missing:
            raise HubNotFoundError(f"{missing[0]} is no longer in {file.repo}; list its files again")
        parts = [blobs[p] for p in file.parts]
        unchecked = [b.filename for b in parts if not (b.sha256 or b.git_sha1)]
        if unchecked:  # refused before a byte comes: Hearth keeps no file it cannot check
            raise HubChecksumError(f"the hub lists no hash for {unchecked[0]} in {file.repo}, so it cannot be "
                                   "checked; Hearth does not download it")
        models = self.paths.models
        private_dir(models)
        downloads = models / DOWNLOADS_DIR
        target = models / merged_name(file.filename)
        if target.exists():
            if len(parts) == 1 and target.stat().st_size == parts[0].size and matches(target, parts[0]):
                return target  # fetched before
            raise HubError(f"{target} is already there; to download {file.filename} again, remove it first "
                           "(hearth-cli model rm NAME)")
        total = sum(b.size for b in parts)
        self._check_disk(parts, downloads, total if len(parts) > 1 else 0)
        done_before, paths = 0, []
        headers = self._headers()
        for n, blob in enumerate(parts, 1):
            dest = downloads / local_name(blob.filename)
            if dest.is_file() and dest.stat().st_size == blob.size:
                paths.append(dest)  # verified by an earlier run that stopped before the join (or the rename)
                done_before += blob.size
                if progress:
                    progress(HubProgress(done_before, total, 0.0, n, len(parts), blob.filename))
                continue
            report = _reporter(progress, done_before, total, n, len(parts), blob.filename)
            if cancelled(cancel):
                raise DownloadCancelledError("the download was cancelled; nothing was installed")
            try:
                path = download_blob(self._url(file.repo, blob.filename, commit), headers, blob, dest, file.repo,
                                     report, cancel)
            except HubGatedError:
                raise HubGatedError(self._gated_words(file.repo), file.repo) from None
            paths.append(path)
            done_before += blob.size
        if len(parts) == 1:
            os.replace(paths[0], target)
            fsync_dir(models)
            _clean_downloads(downloads, parts)
            return target
        from engine.hub_split import merge_split_gguf

        try:
            merged = merge_split_gguf(paths, target, cancel=cancel)
        except DownloadCancelledError:
            raise  # the verified parts stay: the next call only joins them
        except HubError as exc:  # genuine parts (their hashes matched) that do not make one model: nothing to resume
            for p in paths:
                p.unlink(missing_ok=True)
            _clean_downloads(downloads, parts)
            raise HubError(f"{exc}; the downloaded parts were deleted") from None
        for p in paths:  # joined and checked: the parts are no longer needed
            p.unlink(missing_ok=True)
        _clean_downloads(downloads, parts)
        return merged

    def install(self, file: HubFile, progress: HubProgressFn | None = None,
                cancel: CancelToken | None = None) -> LibraryModel:
        """Download ``file`` and add it to the model library (a hub model: removing it deletes the file)."""
        from engine.library import ModelLibrary

        path = self.download(file, progress, cancel)
        return ModelLibrary(self.paths).add(path, origin=ModelOrigin.HUB)

    # helpers ------------------------------------------------------------------------------------------------
    def _api(self):
        _quiet_client()
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.endpoint, token=self._token(), library_name="hearth")

    def _headers(self) -> dict[str, str]:
        _quiet_client()
        from huggingface_hub.utils import build_hf_headers

        return build_hf_headers(token=self._token(), library_name="hearth")

    def _url(self, repo: str, filename: str, commit: str) -> str:
        """The file at the commit its listed hash is of, so every part of a split model is of one commit."""
        from urllib.parse import quote

        return f"{self.endpoint}/{repo}/resolve/{commit}/{quote(filename)}"

    def _gated_words(self, repo: str) -> str:
        if self.has_token():
            return (f"{repo} is gated and the stored token may not open it: accept its terms on huggingface.co "
                    "with the account the token belongs to, or add another with 'hearth-cli hub login --token-file F'")
        return gated_message(repo)

    def _check_disk(self, parts: list[RemoteBlob], downloads: Path, merged: int) -> None:
        """Refuse before a byte is downloaded when the disk cannot hold it (the parts and their join)."""
        have = 0
        for b in parts:
            for p in (downloads / local_name(b.filename), downloads / (local_name(b.filename) + ".part")):
                if p.is_file():
                    have += min(p.stat().st_size, b.size)
        need = sum(b.size for b in parts) - have + merged + DISK_MARGIN_BYTES
        free = shutil.disk_usage(self.paths.models).free
        if need > free:
            raise HubError(f"not enough disk space in {self.paths.models}: the download needs {size_words(need)}, "
                           f"{size_words(free)} is free")

    def _call(self, fn, what: str, repo: str | None = None):
        """A huggingface_hub call with its failures as Hearth's errors (plain words, no token)."""
        import httpx2
        from huggingface_hub import errors as hf

        try:
            return fn()
        except hf.GatedRepoError:
            raise HubGatedError(self._gated_words(repo or what), repo or "") from None
        except (hf.RepositoryNotFoundError, hf.RevisionNotFoundError, hf.RemoteEntryNotFoundError):
            raise HubNotFoundError(f"{repo or what} is not on the Hugging Face Hub (or it is private: add a token "
                                   "with 'hearth-cli hub login --token-file F')") from None
        except hf.OfflineModeIsEnabled:
            raise HubOfflineError("cannot reach the Hugging Face Hub (HF_HUB_OFFLINE is set); "
                                  "models already here keep working") from None
        except hf.HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else "?"
            raise HubError(f"the Hugging Face Hub answered {status} while {_while(what, repo)}; try again later") from None
        except httpx2.TransportError as exc:
            raise HubOfflineError(f"cannot reach the Hugging Face Hub at {self.endpoint} ({_short(exc)}); "
                                  "models already here keep working") from None
        except (ValueError, KeyError, TypeError) as exc:  # a reply that is not the hub's JSON
            raise HubError(f"the Hugging Face Hub at {self.endpoint} sent a reply Hearth cannot read while "
                           f"{_while(what, repo)} ({type(exc).__name__})") from None


_session_ready = False


def _quiet_client() -> None:
    """Before huggingface_hub is first imported (it reads its settings then): no telemetry, no implicit token.
    And its shared HTTP client gets timeouts: its default has none, and ``list_models`` passes none, so a
    server that accepts the connection and never answers would hold a search for ever."""
    global _session_ready
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
    if _session_ready:
        return
    from huggingface_hub.utils import _http, set_client_factory

    def bounded(request) -> None:
        # list_models passes timeout=None explicitly, which overrides a client default: set it on the request.
        timeout = request.extensions.get("timeout") or {}
        if all(v is None for v in timeout.values()):
            request.extensions["timeout"] = {"connect": CONNECT_TIMEOUT_S, "read": API_TIMEOUT_S,
                                             "write": API_TIMEOUT_S, "pool": API_TIMEOUT_S}

    def factory():
        client = _http.default_client_factory()  # its request hook (offline mode, request ids) kept
        client.event_hooks["request"] = [*client.event_hooks["request"], bounded]
        return client

    set_client_factory(factory)
    _session_ready = True


def _while(what: str, repo: str | None) -> str:
    return f"listing {repo}" if repo else what


def _short(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__)[:160]


def _hex(value, length: int) -> str | None:
    text = value.lower() if isinstance(value, str) else ""
    return text if len(text) == length and all(c in "0123456789abcdef" for c in text) else None


def _repo(m) -> HubRepo:
    downloads, likes = getattr(m, "downloads", 0), getattr(m, "likes", 0)
    modified = getattr(m, "last_modified", None)
    return HubRepo(id=str(m.id)[:200], downloads=downloads if isinstance(downloads, int) else 0,
                   likes=likes if isinstance(likes, int) else 0,
                   gated=bool(getattr(m, "gated", False)),  # False, "auto" or "manual"
                   last_modified=modified.isoformat() if hasattr(modified, "isoformat") else "")


def _reporter(progress: HubProgressFn | None, before: int, total: int, part: int, parts: int, filename: str):
    if progress is None:
        return None
    return lambda done, speed: progress(HubProgress(before + done, total, speed, part, parts, filename))


def _clean_downloads(downloads: Path, parts: list[RemoteBlob]) -> None:
    """Once installed: the parts' lock files (as engine/model/fetch.py's), and the folder when it is empty."""
    for b in parts:
        (downloads / (local_name(b.filename) + ".lock")).unlink(missing_ok=True)
    try:
        downloads.rmdir()
    except OSError:  # other downloads are still there
        pass

