"""Window cold start with each catalog model (not a test): when the window is interactive and when the
model is ready, measured by ``hearth --startup-probe`` offscreen.

    python bench/window_start.py [--home DIR] [--runs 3]

``--home`` is a data dir whose ``models/`` holds the catalog GGUFs (default: the test cache's home,
``$HEARTH_TEST_CACHE/home``). Each run starts a new process in a fresh data dir that shares the models
and their conversions (so "cold" is a new process with the page cache warm, not a first conversion,
which ``model convert`` times on its own). Prints a table and writes bench/results/window_start.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def probe(model: str, home: Path) -> dict:
    """One process: the probe's JSON line plus the wall time from just before launch."""
    with tempfile.TemporaryDirectory(prefix="hearth-start-") as tmp:
        data = Path(tmp)
        for sub in ("models", "converted"):
            (data / sub).symlink_to(home / sub)
        env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
        started = time.time()
        proc = subprocess.run([sys.executable, "-m", "app.main", "--startup-probe", "--data-dir", str(data),
                               "--model", model, "--provider", "cpu"], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"--startup-probe with {model} failed ({proc.returncode}): {proc.stderr[-800:]}")
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    line["launch_to_interactive_ms"] = (line["window_interactive_unix"] - started) * 1000
    line["launch_to_ready_ms"] = (line["model_ready_unix"] - started) * 1000
    return line


def main(argv: list[str] | None = None) -> int:
    from engine.model.fetch import load_manifest

    cache = Path(os.environ.get("HEARTH_TEST_CACHE", ROOT / ".test-cache"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, default=cache / "home")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    _, catalog = load_manifest()
    rows = []
    for name, entry in catalog.items():
        if not (args.home / "models" / entry.filename).is_file():
            print(f"{name}: not in {args.home / 'models'}; skipped", file=sys.stderr)
            continue
        probe(name, args.home)  # the first run may convert: not counted
        runs = [probe(name, args.home) for _ in range(args.runs)]
        rows.append({"model": name, "runs": runs,
                     "interactive_ms": statistics.median(r["launch_to_interactive_ms"] for r in runs),
                     "ready_ms": statistics.median(r["launch_to_ready_ms"] for r in runs)})
    print(f"{'model':<24} {'window interactive':>20} {'model ready':>14}")
    for r in rows:
        print(f"{r['model']:<24} {r['interactive_ms'] / 1000:>19.2f}s {r['ready_ms'] / 1000:>13.2f}s")
    out = ROOT / "bench" / "results" / "window_start.json"
    out.write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(), "runs": args.runs,
                               "models": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
