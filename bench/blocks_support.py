"""What bench/blocks.py's scenarios share: the data dir, the service, the text, the disk figures, the table.

Everything reaches the engine through ``engine.api`` (and ``engine.types``), so the bench measures the same
way before and after the block store replaces the checkpoint files.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import platform
import queue
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.api import (  # noqa: E402
    Hearth,
    HearthPaths,
    model_identity,
    resolve_paths,
    saved_contexts,
    tokenize_file,
    tokenizer_file,
)

log = logging.getLogger("bench.blocks")
MODEL_HOME = Path(os.environ.get("HEARTH_TEST_CACHE", ROOT / ".test-cache")) / "home"
BLOCK_TOKENS = 256  # the block size: the goals are stated in blocks of this many tokens

# A seeded walk over these words makes prose that tokenizes like prose (identical repeated lines do not).
_NOUNS = ("river harbor lantern meadow copper willow signal orchard canyon ember glacier compass thistle "
          "beacon quarry saddle marble falcon prairie cedar tundra anchor velvet engine ledger mill bridge "
          "village council farmer winter season market archive railway tower valley forest letter journey "
          "storm garden teacher doctor captain sailor merchant museum library kitchen window mountain").split()
_VERBS = ("carried measured crossed described repaired followed recorded opened studied returned built "
          "watched reached gathered shaped guarded counted painted traded planted named lifted").split()
_ADJ = ("quiet narrow ancient bright heavy distant careful golden northern steady silver crowded hidden "
        "early patient wooden broken gentle famous hollow").split()
_LINKS = ("Meanwhile", "Later that year", "Because of this", "In the spring", "Nobody knew why",
          "According to the ledger", "By the evening", "Even so", "At first", "Years afterwards")


def sentence(rng: random.Random) -> str:
    words = [rng.choice(_LINKS) + "," if rng.random() < 0.25 else "The"]
    if words[0] != "The":
        words.append("the")
    words += [rng.choice(_ADJ), rng.choice(_NOUNS), rng.choice(_VERBS), "the", rng.choice(_NOUNS)]
    if rng.random() < 0.5:
        words += ["near", "the", rng.choice(_ADJ), rng.choice(_NOUNS)]
    if rng.random() < 0.3:
        words += ["in", str(rng.randint(1780, 1990))]
    return " ".join(words) + rng.choice((".", ".", ".", "!", "?"))


def prose(seed: int, tokens: int, count: Callable[[str], int]) -> str:
    """Deterministic paragraphs of about ``tokens`` tokens (a little over, never under)."""
    rng = random.Random(seed)
    paragraphs: list[str] = []
    while count("\n\n".join(paragraphs)) < tokens:
        paragraphs += [" ".join(sentence(rng) for _ in range(rng.randint(4, 9))) for _ in range(8)]
    # then the fewest paragraphs that reach ``tokens`` (a bisection: counting is linear in the text)
    low, high = 1, len(paragraphs)
    while low < high:
        mid = (low + high) // 2
        low, high = (mid + 1, high) if count("\n\n".join(paragraphs[:mid])) < tokens else (low, mid)
    return "\n\n".join(paragraphs[:low])


# the data dir and the service ----------------------------------------------------------------------------
@contextmanager
def data_dir(given: str | None, model_home: Path, label: str) -> Iterator[Path]:
    """``given`` (kept), else a fresh temporary one (removed); either shares ``model_home``'s models and
    conversions by symlink, so nothing is copied or converted again."""
    if given:
        home = Path(given)
        home.mkdir(parents=True, exist_ok=True)
        _link_models(home, model_home)
        yield home
        return
    with tempfile.TemporaryDirectory(prefix=f"hearth-blocks-{label}-") as tmp:
        home = Path(tmp)
        _link_models(home, model_home)
        yield home


def _link_models(home: Path, model_home: Path) -> None:
    for sub in ("models", "converted"):
        if not (home / sub).exists():
            if not (model_home / sub).is_dir():
                raise SystemExit(f"{model_home / sub} is missing: run the tests once (they fetch the model) "
                                 f"or 'hearth-cli model fetch --data-dir {model_home}'")
            (home / sub).symlink_to((model_home / sub).resolve())


def open_hearth(home: Path, weights: str, provider: str) -> Hearth:
    """A loaded service on ``home``'s default model. The one place a scenario makes a service: a
    comparison of two stores in one run plugs in here (see ``restore --compare-dirs``)."""
    hearth = Hearth(resolve_paths(home).ensure(), weights=weights, provider=provider)
    hearth.load()
    return hearth


def token_counter(paths: HearthPaths) -> Callable[[str], int]:
    """Tokens of a text under the default model's vocabulary (its GGUF header; no model loaded)."""
    gguf = tokenizer_file(paths, None)
    return lambda text: len(tokenize_file(gguf, text))


def kv_bytes_per_token(paths: HearthPaths, weights: str) -> int:
    """The KV's own size per token (layers × K and V × heads × head size × element size)."""
    identity, _ = model_identity(paths, None, weights)
    return identity.shape.bytes_per_token


# disk figures ----------------------------------------------------------------------------------------------
def store_files(paths: HearthPaths) -> list[Path]:
    return [p for p in paths.checkpoints.rglob("*") if p.is_file()]


def disk_figures(paths: HearthPaths) -> dict[str, int]:
    """What the saved-context directory holds, counted by the file system, not by the store."""
    files = store_files(paths)
    stats = [p.stat() for p in files]
    return {"files": len(files), "apparent_bytes": sum(s.st_size for s in stats),
            "allocated_bytes": sum(s.st_blocks * 512 for s in stats)}


def process_io() -> dict[str, int]:
    """This process's bytes read from and written to storage (Linux /proc/self/io; zeros elsewhere)."""
    try:
        fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
        return {"read_bytes": int(fields["read_bytes"]), "write_bytes": int(fields["write_bytes"])}
    except (OSError, KeyError, ValueError):
        return {"read_bytes": 0, "write_bytes": 0}


def usage(hearth: Hearth) -> dict[str, Any]:
    """The saved-contexts service's usage (whatever fields it has: unique/shared/written bytes once the
    block store reports them) and the file system's view of the same directory."""
    report = saved_contexts(hearth).usage()
    out = {}
    for field in dataclasses.fields(report):
        value = getattr(report, field.name)
        out[field.name] = dict(value) if isinstance(value, Mapping) else value
    out["disk"] = disk_figures(hearth.paths)
    out["rows_bytes"] = browser_rows_bytes(hearth)
    return out


def browser_rows_bytes(hearth: Hearth) -> int:
    """What the browser's rows add up to: each chat's saved contexts (every model's), headers checked."""
    service = saved_contexts(hearth)
    return sum(service.context_status(cid).disk_bytes for cid in sorted(hearth.conversations.ids()))


def drop_page_cache(paths: HearthPaths) -> int:
    """Evict the saved-context files' pages (no root needed: POSIX_FADV_DONTNEED on each). Returns the
    files dropped. Dirty pages are written first, or the kernel would keep them."""
    os.sync()
    dropped = 0
    for path in store_files(paths):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            dropped += 1
        finally:
            os.close(fd)
    return dropped


# the engine thread the embedded server posts to -------------------------------------------------------------
class EngineThread:
    """One thread that owns the service, as the window's engine thread does: the server's jobs and the
    bench's own calls run on it in order."""

    def __init__(self) -> None:
        self.jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="bench-engine", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            job()

    def post(self, job: Callable[[], None]) -> None:
        self.jobs.put(job)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the engine thread and return its result (or raise its error) here."""
        done: Future = Future()

        def job() -> None:
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed back to the caller, who raises it
                done.set_exception(exc)

        self.post(job)
        return done.result()

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join(60)


# output ----------------------------------------------------------------------------------------------------
def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = [" | ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.0f}"
    return str(v)


def mib(n: float) -> float:
    return n / (1 << 20)


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "load_average": os.getloadavg(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_json(path: str | None, result: dict) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=1, default=str))
        log.info("wrote %s", path)
