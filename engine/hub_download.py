"""One file from the Hugging Face Hub, streamed to a private ``.part`` file that a failure or a cancel
keeps, resumed with an HTTP ``Range`` request, and checked against the hub's hash before it is renamed.

Why not ``huggingface_hub.hf_hub_download``: it writes into the hub's own cache (``~/.cache/huggingface``
or HF_HOME), reports progress only to a tqdm bar, has no way to stop a download from another thread, and
its checks are the ETag's; Hearth needs progress with speed, Cancel, its own ``.part`` in
``<models>/.downloads`` (as engine/model/fetch.py's wheels) and the SHA-256 checked over the whole file.
So the bytes come through the hub client's own HTTP session (``get_session``, with ``build_hf_headers``'
headers: its user agent and, for a gated repo, the token), and this loop does the rest.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from engine.errors import DownloadCancelledError, HubChecksumError, HubError, HubGatedError, HubNotFoundError
from engine.file_lock import StoreLock
from engine.fsutil import fsync_dir
from engine.hub_files import RemoteBlob
from engine.model.fetch import cancelled, part_path
from engine.model.memory import size_words
from engine.private_files import open_private, private_dir

log = logging.getLogger(__name__)

CHUNK = 1 << 20
CONNECT_TIMEOUT_S = 15.0
READ_TIMEOUT_S = 60.0  # a server silent this long has dropped the download: it resumes next time
Progress = Callable[[int, float], None]  # (bytes of this file so far, bytes per second of this attempt)


class HubDownloadLock(StoreLock):
    """One download of a file at a time across processes (two would write one ``.part``)."""

    def __init__(self, dest: Path):
        super().__init__(dest.with_name(dest.name + ".lock"), timeout_s=0.0)

    def busy_error(self) -> HubError:
        return HubError(f"another Hearth process is downloading {self.path.name.removesuffix('.lock')}; "
                        "wait for it to finish")


def download_blob(url: str, headers: dict[str, str], blob: RemoteBlob, dest: Path, repo: str,
                  progress: Progress | None = None, cancel=None) -> Path:
    """``url`` into ``dest`` through ``dest``'s ``.part``: resumed, verified, renamed into place. A network
    failure or a cancel keeps the ``.part``; a file whose hash is wrong is deleted (HubChecksumError)."""
    import httpx2

    private_dir(dest.parent)
    with HubDownloadLock(dest).held():
        part = part_path(dest)
        try:
            _fetch_rest(url, headers, blob, part, repo, progress, cancel)
        except (httpx2.TransportError, OSError) as exc:
            kept = part.stat().st_size if part.exists() else 0
            again = f"run it again to resume ({size_words(kept)} kept)" if kept else "try again"
            raise HubError(f"the download of {blob.filename} from {repo} failed ({_reason(exc)}); {again}") from None
        _verify(part, blob, repo)
        os.replace(part, dest)
        fsync_dir(dest.parent)
    return dest


def _fetch_rest(url: str, headers: dict[str, str], blob: RemoteBlob, part: Path, repo: str,
                progress: Progress | None, cancel) -> None:
    import httpx2
    from huggingface_hub.utils import get_session

    have = part.stat().st_size if part.exists() else 0
    if have > blob.size:  # not the file listed now: start again
        part.unlink()
        have = 0
    if have == blob.size and have:
        return  # complete already; the hash decides
    request = {**headers, **({"Range": f"bytes={have}-"} if have else {})}
    timeout = httpx2.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    with get_session().stream("GET", url, headers=request, timeout=timeout, follow_redirects=True) as resp:
        if resp.status_code == 416 and have:  # the file changed under the .part: start again
            part.unlink()
            resp.close()
            return _fetch_rest(url, headers, blob, part, repo, progress, cancel)
        _check_status(resp, repo, blob.filename)
        if have and resp.status_code != 206:
            log.info("the hub ignored the range request for %s (status %s); downloading it whole",
                     blob.filename, resp.status_code)
            have = 0
        start, done = time.monotonic(), have
        fd = open_private(part, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if have else os.O_TRUNC))
        with os.fdopen(fd, "wb") as out:
            if progress:
                progress(done, 0.0)
            for block in resp.iter_raw(CHUNK):
                if cancelled(cancel):
                    raise DownloadCancelledError(f"the download of {blob.filename} was cancelled; nothing was "
                                                 f"installed ({size_words(done)} kept to resume next time)")
                if done + len(block) > blob.size:  # more than the hub listed: not the file it listed
                    part.unlink(missing_ok=True)
                    raise HubChecksumError(f"{repo} sent more than the {blob.size:,} bytes it lists for "
                                           f"{blob.filename}; the partial download was deleted: try again")
                out.write(block)
                done += len(block)
                if progress:
                    progress(done, (done - have) / max(time.monotonic() - start, 1e-6))
            out.flush()
            os.fsync(out.fileno())
    if done < blob.size:  # the stream ended early without an error
        raise ConnectionError(f"the connection closed after {done:,} of {blob.size:,} bytes")


def _check_status(resp, repo: str, filename: str) -> None:
    """The hub's refusals as Hearth's errors (the hub says why in X-Error-Code, as huggingface_hub reads it)."""
    status = resp.status_code
    if status in (200, 206):
        return
    code = resp.headers.get("X-Error-Code", "")
    if code == "GatedRepo" or (status in (401, 403) and code != "RepoNotFound"):
        raise HubGatedError(gated_message(repo), repo)
    if status in (401, 404) or code in ("RepoNotFound", "EntryNotFound"):
        raise HubNotFoundError(f"{filename} is not in {repo} on the Hugging Face Hub (or the repository is private)")
    raise HubError(f"the Hugging Face Hub answered {status} for {filename} in {repo}; try again later")


def gated_message(repo: str) -> str:
    return (f"{repo} is gated: accept its terms on huggingface.co, then add a token with "
            "'hearth-cli hub login --token-file F'")


def _digest(path: Path, blob: RemoteBlob) -> tuple[str, str, str] | None:
    """(the file's hash, the hub's, which kind) by the hub's kind of hash: LFS SHA-256, else the git blob
    id; None when the hub lists neither."""
    if blob.sha256:
        h, want, kind = hashlib.sha256(), blob.sha256.lower(), "SHA-256"
    elif blob.git_sha1:
        h, want, kind = hashlib.sha1(f"blob {blob.size}\0".encode()), blob.git_sha1.lower(), "git hash"  # noqa: S324
    else:
        return None
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            h.update(block)
    return h.hexdigest(), want, kind


def matches(path: Path, blob: RemoteBlob) -> bool:
    """Whether the file at ``path`` is the one the hub lists."""
    found = _digest(path, blob)
    return found is not None and found[0] == found[1]


def _verify(part: Path, blob: RemoteBlob, repo: str) -> None:
    """The whole file against the hub's hash; a file that does not match (or cannot be checked) is deleted."""
    found = _digest(part, blob)
    if found is None:
        part.unlink(missing_ok=True)
        raise HubChecksumError(f"the hub lists no hash for {blob.filename} in {repo}, so it cannot be checked; "
                               "Hearth did not keep it")
    digest, want, kind = found
    if digest != want:
        part.unlink(missing_ok=True)
        raise HubChecksumError(f"{blob.filename} from {repo} does not match the {kind} the hub lists for it "
                               f"({digest[:16]}…, expected {want[:16]}…); the download was deleted: try again")


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text[:200]
