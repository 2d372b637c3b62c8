"""A stand-in for the Hugging Face Hub on 127.0.0.1 (a free port, a thread): the endpoints huggingface_hub
2.4's HfApi and Hearth's download call, answered as the hub answers them, over real files.

* ``GET /api/models?search=&filter=gguf&sort=&limit=&expand=`` — the repositories whose id holds the search;
* ``GET /api/models/OWNER/NAME[/revision/REV][?blobs=true]`` — the repo with its ``siblings`` (size, blobId,
  and for LFS files ``lfs: {sha256, size, pointerSize}``);
* ``HEAD``/``GET /OWNER/NAME/resolve/REV/FILE`` — the file, with ``ETag``, ``X-Repo-Commit``,
  ``X-Linked-Size``/``X-Linked-Etag`` as the hub sends for LFS files, and ``Range`` requests (206);
  a gated repo answers 401 (no token) or 403 (another token) with ``X-Error-Code: GatedRepo``; an unknown
  repo or file 404 with ``RepoNotFound`` / ``EntryNotFound``.

Switches: ``api_status`` / ``resolve_status`` (refuse those requests), ``pause_s`` (a slow download),
``cut_after`` (send that many bytes of the next file download, then drop the connection). A repo added with
``wrong_sha256`` lists a SHA-256 its file does not have; ``size_delta``, a wrong size; ``no_hash``, no hash;
``lfs=False``, git blob ids only. ``requests`` records what came (method, path, query, Range, whether an
Authorization header came — never the token itself).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_SHA_CACHE: dict[tuple[str, int, float], str] = {}


def file_sha256(path: Path) -> str:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime)
    if key not in _SHA_CACHE:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
        _SHA_CACHE[key] = h.hexdigest()
    return _SHA_CACHE[key]


@dataclass
class Repo:
    id: str
    files: dict[str, Path]  # name in the repo → the real file served
    gated: bool = False
    token: str = ""  # the token that opens a gated repo
    wrong_sha256: bool = False
    lfs: bool = True  # False: listed as plain git files (blobId only)
    no_hash: bool = False  # listed with neither an LFS hash nor a blob id
    size_delta: int = 0  # listed this many bytes larger (negative: smaller) than the file served
    downloads: int = 0
    likes: int = 0
    tags: list[str] = field(default_factory=lambda: ["gguf"])


class HubServer:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[dict] = []
        self.cut_after: int | None = None
        self.api_status: int | None = None  # answer every /api/ request with this status
        self.resolve_status: int | None = None  # answer every file request with this status
        self.pause_s = 0.0  # a pause after each MiB of a file, for a download slow enough to interrupt
        self._lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def add_repo(self, repo_id: str, files: dict[str, Path], **options) -> Repo:
        repo = Repo(repo_id, dict(files), **options)
        self.repos[repo_id] = repo
        return repo

    def record(self, entry: dict) -> None:
        with self._lock:
            self.requests.append(entry)

    def downloads(self) -> list[dict]:
        return [r for r in self.requests if r["method"] == "GET" and "/resolve/" in r["path"]]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


def _sibling(repo: Repo, name: str, path: Path) -> dict:
    size = path.stat().st_size + repo.size_delta
    if repo.no_hash:
        return {"rfilename": name, "size": size}
    if not repo.lfs:
        blob = hashlib.sha1(f"blob {size}\0".encode() + path.read_bytes()).hexdigest()  # noqa: S324
        return {"rfilename": name, "size": size, "blobId": blob}
    sha = file_sha256(path)
    if repo.wrong_sha256:
        sha = hashlib.sha256(b"not this file").hexdigest()
    return {"rfilename": name, "size": size, "blobId": hashlib.sha1(name.encode()).hexdigest(),  # noqa: S324
            "lfs": {"sha256": sha, "size": size, "pointerSize": 135}}


def _info(repo: Repo, blobs: bool) -> dict:
    siblings = [_sibling(repo, n, p) if blobs else {"rfilename": n} for n, p in repo.files.items()]
    return {"_id": repo.id, "id": repo.id, "modelId": repo.id, "author": repo.id.split("/")[0], "sha": COMMIT,
            "lastModified": "2025-01-02T03:04:05.000Z", "private": False,
            "gated": "manual" if repo.gated else False, "disabled": False, "downloads": repo.downloads,
            "likes": repo.likes, "tags": repo.tags, "library_name": "gguf", "siblings": siblings}


def _handler(hub: HubServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def _json(self, status: int, body, headers: dict | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _error(self, status: int, code: str, message: str) -> None:
            self._json(status, {"error": message}, {"X-Error-Code": code, "X-Error-Message": message})

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            path = unquote(url.path)
            hub.record({"method": self.command, "path": path, "query": url.query, "range": self.headers.get("Range"),
                        "authorized": self.headers.get("Authorization") is not None})
            query = parse_qs(url.query)
            if path.startswith("/api/") and hub.api_status:
                return self._error(hub.api_status, "", "Internal Error")
            if path == "/api/models":
                return self._search(query)
            if path.startswith("/api/models/"):
                rest = path[len("/api/models/"):].split("/")
                repo = hub.repos.get("/".join(rest[:2]))
                if repo is None:
                    return self._error(401, "RepoNotFound", "Repository not found")
                return self._json(200, _info(repo, query.get("blobs") == ["true"]))
            pieces = path.lstrip("/").split("/", 4)
            if len(pieces) == 5 and pieces[2] == "resolve":
                return self._file("/".join(pieces[:2]), pieces[4])
            self._error(404, "", "Not found")

        def _search(self, query: dict) -> None:
            words = (query.get("search") or [""])[0].lower()
            wanted = query.get("filter") or []
            found = [r for r in hub.repos.values() if words in r.id.lower() and all(f in r.tags for f in wanted)]
            found.sort(key=lambda r: -r.downloads)
            limit = int((query.get("limit") or ["1000"])[0])
            self._json(200, [{k: v for k, v in _info(r, False).items() if k != "siblings"} for r in found[:limit]])

        def _file(self, repo_id: str, name: str) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(401, "RepoNotFound", "Repository not found")
            if hub.resolve_status:
                code = "EntryNotFound" if hub.resolve_status == 404 else ""
                return self._error(hub.resolve_status, code, "refused")
            if repo.gated:
                auth = self.headers.get("Authorization")
                if auth is None:
                    return self._error(401, "GatedRepo", "Access to model is restricted. You must have access to it "
                                       "and be authenticated to access it. Please log in.")
                if auth != f"Bearer {repo.token}":
                    return self._error(403, "GatedRepo", "Access to model is restricted and you are not in the "
                                       "authorized list.")
            path = repo.files.get(name)
            if path is None:
                return self._error(404, "EntryNotFound", "Entry not found")
            size = path.stat().st_size
            start = 0
            wanted = self.headers.get("Range")
            if wanted and wanted.startswith("bytes=") and wanted.endswith("-"):
                start = int(wanted[6:-1])
                if start >= size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
            etag = file_sha256(path) if repo.lfs else hashlib.sha1(name.encode()).hexdigest()  # noqa: S324
            self.send_response(206 if start else 200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size - start))
            self.send_header("Accept-Ranges", "bytes")
            if start:
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            self.send_header("ETag", f'"{etag}"')
            self.send_header("X-Repo-Commit", COMMIT)
            if repo.lfs:
                self.send_header("X-Linked-Size", str(size))
                self.send_header("X-Linked-Etag", f'"{etag}"')
            self.end_headers()
            if self.command == "HEAD":
                return
            cut, hub.cut_after = hub.cut_after, None
            sent = 0
            with open(path, "rb") as fh:
                fh.seek(start)
                while block := fh.read(1 << 20):
                    if cut is not None and sent + len(block) > cut:
                        self.wfile.write(block[:cut - sent])
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(2)  # the cut: the client sees the body end early
                        return
                    try:
                        self.wfile.write(block)
                    except (BrokenPipeError, ConnectionResetError):  # the client cancelled
                        return
                    sent += len(block)
                    if hub.pause_s:
                        time.sleep(hub.pause_s)

    return Handler
