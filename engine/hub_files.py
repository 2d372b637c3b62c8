"""What the Hugging Face Hub lists, as Hearth shows it: repositories, GGUF files (a split GGUF as one),
their quantization from the file name, and a memory estimate before anything is downloaded.

Pure functions over what ``huggingface_hub`` returned; nothing here touches the network. Every count and
name from the hub is bounded and checked before it becomes a local file name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.errors import HubError
from engine.model import memory

MAX_SIBLINGS = 5000  # files of one repository looked at (a repo of every quant of a 70B model has ~100)
MAX_FILES = 500  # GGUF files (split ones counted once) listed for one repository
MAX_PARTS = 256  # parts of one split GGUF (llama.cpp's gguf-split writes 5 digits; real ones stay under 100)
MAX_FILE_BYTES = 1 << 40  # a size the hub lists above 1 TiB is not a model Hearth can run
MAX_NAME_CHARS = 255

_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
# The quantization names llama.cpp's tools put in file names, longest first so Q4_K_M wins over Q4_K.
_QUANT = re.compile(r"(?<![A-Z0-9])(IQ[1-4]_(?:XXS|XS|NL|S|M)|Q[2-8]_K_(?:XL|S|M|L)|Q[2-8]_K|Q[4-8]_[01]|"
                    r"TQ[12]_0|MXFP4|BF16|F16|F32|FP16|FP32)(?![A-Z0-9])")

# What running a model takes beyond its weights, before its file's header can be read (engine/model/memory.py
# measures the real figures once the file is here): the runtime, its working memory, and the KV cache of a
# modest context, taken as a tenth of the weights (SmolLM2 135M's 2,048-token fp32 cache is 90 MiB next to
# 100 MiB of weights; larger models' caches are a smaller share of their weights).
KV_SHARE = 0.10


@dataclass(frozen=True)
class HubRepo:
    """A GGUF repository the hub's search found."""

    id: str
    downloads: int
    likes: int
    gated: bool
    last_modified: str  # ISO 8601, "" when the hub did not say


@dataclass(frozen=True)
class HubFile:
    """One model in a repository: a GGUF, or all parts of a split GGUF (``filename`` is the first part,
    ``parts`` all of them in order, ``size`` their sum). ``sha256`` is the hub's LFS hash of the (first)
    file, None when the hub lists none; ``memory_bytes`` is :func:`memory_estimate`."""

    repo: str
    filename: str
    size: int
    sha256: str | None
    quant: str
    parts: tuple[str, ...]
    memory_bytes: int

    @property
    def is_split(self) -> bool:
        return len(self.parts) > 1


@dataclass(frozen=True)
class HubProgress:
    """A download's progress: bytes of all parts together, the speed of this attempt, the part (1-based)."""

    done_bytes: int
    total_bytes: int
    bytes_per_s: float
    part: int
    parts: int
    filename: str


@dataclass(frozen=True)
class RemoteBlob:
    """One file as the hub lists it: its size and the hash to check it with."""

    filename: str
    size: int
    sha256: str | None  # LFS files: the SHA-256 of the content
    git_sha1: str | None  # other files: the git blob id, sha1 of "blob SIZE\\0" + content


def check_repo_id(repo: str) -> str:
    """``OWNER/NAME`` as the hub spells it, else HubError (nothing odd reaches a URL or a log)."""
    repo = repo.strip()
    if not _REPO.match(repo) or ".." in repo:
        raise HubError(f"{repo[:100]!r} is not a Hugging Face repository name; write it as OWNER/NAME")
    return repo


def check_filename(name: str) -> str:
    """A file path inside a repository (folders allowed), refused when it could escape a folder."""
    parts = name.split("/")
    if (not name or len(name) > 1000 or name.startswith("/") or "\\" in name or not name.isprintable()
            or any(p in ("", ".", "..") for p in parts) or len(parts[-1]) > MAX_NAME_CHARS):
        raise HubError(f"{name[:100]!r} is not a file name Hearth will download")
    return name


def local_name(filename: str) -> str:
    """The name a hub file gets in the models dir: its base name (folders in the repo dropped)."""
    return check_filename(filename).rsplit("/", 1)[-1]


def quant_of(filename: str) -> str:
    """The quantization named in a GGUF's file name ("Q4_K_M", "IQ4_XS", "F16"...), "" when none is."""
    found = _QUANT.findall(local_name(filename).upper().replace("-", "_").removesuffix(".GGUF"))
    if not found:
        return ""
    quant = found[-1]  # "Llama-3-8B-Q8_0" and "model.q4_1": the last one names the weights
    return {"FP16": "F16", "FP32": "F32"}.get(quant, quant)


def memory_estimate(size: int) -> int:
    """RAM to run a GGUF of ``size`` bytes, before its header is known: the weights at about their file's
    size, a modest context's KV cache (``KV_SHARE``), and the runtime's own memory (engine/model/memory.py)."""
    return int(size * (1 + KV_SHARE)) + memory.RUNTIME_BYTES + memory.ACTIVATION_BYTES


def split_info(filename: str) -> tuple[str, int, int] | None:
    """(stem, part number, part count) of a ``-00001-of-00003.gguf`` part, else None."""
    m = _SPLIT.match(filename)
    if not m:
        return None
    return m["stem"], int(m["no"]), int(m["count"])


def merged_name(filename: str) -> str:
    """The single GGUF a split one becomes: ``model-00001-of-00003.gguf`` → ``model.gguf``."""
    info = split_info(local_name(filename))
    return f"{info[0]}.gguf" if info else local_name(filename)


def gguf_files(repo: str, blobs: list[RemoteBlob]) -> list[HubFile]:
    """The repository's models: each plain GGUF, and each split GGUF whose parts are all there, by name."""
    plain: list[RemoteBlob] = []
    groups: dict[tuple[str, int], dict[int, RemoteBlob]] = {}
    for blob in blobs[:MAX_SIBLINGS]:
        if not blob.filename.lower().endswith(".gguf"):
            continue
        info = split_info(blob.filename)
        if info is None:
            plain.append(blob)
        elif 1 <= info[1] <= info[2] <= MAX_PARTS:
            groups.setdefault((info[0], info[2]), {})[info[1]] = blob
    files = [_hub_file(repo, [b]) for b in plain]
    for (_, count), parts in groups.items():
        if len(parts) == count:  # an incomplete split cannot make a model
            files.append(_hub_file(repo, [parts[n] for n in range(1, count + 1)]))
    files.sort(key=lambda f: f.filename)
    return files[:MAX_FILES]


def _hub_file(repo: str, parts: list[RemoteBlob]) -> HubFile:
    size = sum(p.size for p in parts)
    return HubFile(repo=repo, filename=parts[0].filename, size=size, sha256=parts[0].sha256,
                   quant=quant_of(parts[0].filename), parts=tuple(p.filename for p in parts),
                   memory_bytes=memory_estimate(size))
