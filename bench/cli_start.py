"""How long the quick ``hearth-cli`` commands take from launch to exit (not a test): ``--version``,
``tokenize`` of two words and ``model info``, each in a new process, for every model asked for.

    python bench/cli_start.py [--home DIR] [--runs 5] [--source DIR] [--out FILE]

``--home`` is a data dir whose ``models/`` holds the GGUFs (default: the test cache's home,
``$HEARTH_TEST_CACHE/home``). ``--source`` runs another checkout's ``engine``; ``--compare DIR`` also runs
DIR's (an older commit), alternating the two run by run so a busy machine weighs on both alike. Prints a
table (median, min, max over ``--runs``) and writes JSON (default bench/results/cli_start.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf")


def commands(home: Path) -> list[tuple[str, list[str]]]:
    """(label, arguments) for each timed command; the models that are not in ``home`` are left out."""
    runs = [("--version", ["--version"])]
    for name in MODELS:
        gguf = home / "models" / name
        if gguf.is_file():
            short = name.split("-")[0]
            runs.append((f"tokenize ({short})", ["tokenize", "--data-dir", str(home), "--model", str(gguf),
                                                 "hello world"]))
            runs.append((f"model info ({short})", ["model", "info", "--data-dir", str(home), "--model", str(gguf)]))
    return runs


def timed(args: list[str], source: Path) -> float | str:
    """One process from launch to exit, in seconds; or why it failed (an older checkout may lack a command)."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, env=env,
                          cwd=source, timeout=600)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        return (proc.stderr.strip().splitlines() or ["failed"])[-1]
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_home = Path(os.environ.get("HEARTH_TEST_CACHE", ROOT / ".test-cache")) / "home"
    parser.add_argument("--home", type=Path, default=default_home)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--source", type=Path, default=ROOT, help="the checkout whose engine runs")
    parser.add_argument("--compare", type=Path, help="another checkout, run alternately with --source")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cli_start.json")
    args = parser.parse_args()
    sources = [("", args.source)] + ([(" [compare]", args.compare)] if args.compare else [])
    rows = []
    for label, cli_args in commands(args.home):
        times: dict[str, list[float]] = {}
        for tag, source in sources:
            first = timed(cli_args, source)  # once untimed: the page cache holds the files and the bytecode
            if isinstance(first, str):
                rows.append({"command": label + tag, "source": str(source), "error": first})
            else:
                times[tag] = []
        for _ in range(args.runs):
            for tag, source in sources:
                if tag in times:
                    times[tag].append(timed(cli_args, source))
        for tag, source in sources:
            if tag in times:
                runs = times[tag]
                rows.append({"command": label + tag, "source": str(source), "median_s": statistics.median(runs),
                             "min_s": min(runs), "max_s": max(runs), "runs": runs})
    print(f"{'command':<36} {'median':>8} {'min':>8} {'max':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['command']:<36} {r['error']}")
        else:
            print(f"{r['command']:<36} {r['median_s']:>7.2f}s {r['min_s']:>7.2f}s {r['max_s']:>7.2f}s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"source": str(args.source), "python": platform.python_version(),
                                    "cpus": os.cpu_count(), "runs": args.runs, "results": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
