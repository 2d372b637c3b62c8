"""Packaged-build benchmark (not a test): package sizes, installed size, and start-up time to an interactive window.

    python bench/package.py [--exe /opt/hearth/hearth] [--runs 5] [--install] [--no-source] [--platform xcb]
                            [--variant gpu] [--deb FILE] [--tarball FILE]

Sizes come from dist/ (the newest hearth_*.deb and hearth-*.tar.gz) and the installed tree. Start-up runs
``hearth --startup-probe`` offscreen in a fresh data dir and takes the time from just before launching the
process to (a) the first event-loop turn after the window was shown (interactive) and (b) the model being
ready; the model loads on the engine thread behind the window. Each run is done twice: "cold" after dropping
the page cache (root only: ``echo 3 > /proc/sys/vm/drop_caches``; skipped, and said so, where that is not
allowed) and "warm" right after. ``--install`` installs the .deb first and removes it afterwards (root).
``--no-source`` skips the comparison run from the source tree. ``--platform xcb`` runs on an X server instead
of offscreen: ``$DISPLAY``, else an ``Xvfb`` started for the run. ``--variant gpu`` measures the GPU build
(dist/hearth-gpu_*; the probe then runs on CUDA where it can); ``--deb``/``--tarball`` name the packages whose
sizes are reported (a machine the bundle was carried to has no dist/). Prints a table; writes
bench/results/package[-gpu][-xcb].json.
Targets: window interactive within 1 s; the CPU .deb under 250 MB.
"""

from __future__ import annotations

import argparse
import importlib.util
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
RESULTS = ROOT / "bench" / "results"
MB = 1_000_000


def newest(pattern: str) -> Path | None:
    found = sorted((ROOT / "dist").glob(pattern), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def tree_bytes(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def drop_page_cache() -> bool:
    """Empty the page cache (root only): bench/resume.py's, so every benchmark means the same by cold."""
    spec = importlib.util.spec_from_file_location("bench_resume", ROOT / "bench" / "resume.py")
    resume = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(resume)
    return resume.drop_page_cache()


def probe(command: list[str], cold: bool, extra_env: dict[str, str]) -> dict:
    """One launch: milliseconds from just before exec to the interactive window and to the model ready."""
    dropped = drop_page_cache() if cold else False
    with tempfile.TemporaryDirectory(prefix="hearth-bench-") as home:
        env = {**os.environ, **extra_env}
        launched = time.time()
        proc = subprocess.run([*command, "--startup-probe", "--data-dir", home], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=300)
        ended = time.time()
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{"probe"')]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(command)} --startup-probe failed ({proc.returncode}): {proc.stderr[-800:]}")
    data = json.loads(lines[-1])
    return {"cache": "cold" if dropped else "warm", "provider": data.get("provider"),
            "interactive_ms": (data["window_interactive_unix"] - launched) * 1000,
            "model_ready_ms": (data["model_ready_unix"] - launched) * 1000, "exit_ms": (ended - launched) * 1000}


def summarize(runs: list[dict]) -> dict:
    out = {}
    for key in ("interactive_ms", "model_ready_ms", "exit_ms"):
        values = [r[key] for r in runs]
        out[key] = {"median": round(statistics.median(values), 1), "min": round(min(values), 1),
                    "max": round(max(values), 1)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exe", help="the installed hearth (default: /opt/hearth/hearth, else the dist/ bundle)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--install", action="store_true", help="apt install the newest dist/hearth_*.deb first, remove after")
    parser.add_argument("--no-source", action="store_true", help="skip the run from the source tree")
    parser.add_argument("--platform", choices=["offscreen", "xcb"], default="offscreen")
    parser.add_argument("--variant", choices=["cpu", "gpu"], default="cpu", help="which build's packages (default cpu)")
    parser.add_argument("--deb", type=Path, help="the .deb whose size is reported (default: the newest in dist/)")
    parser.add_argument("--tarball", type=Path, help="the .tar.gz whose size is reported (default: the newest in dist/)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    name = "hearth" if args.variant == "cpu" else "hearth-gpu"
    deb = args.deb or newest(f"{name}_*.deb")
    tarball = args.tarball or newest(f"{name}-[0-9]*.tar.gz")
    for given in (args.deb, args.tarball):
        if given is not None and not given.is_file():
            parser.error(f"no such file: {given}")
    installed_here = False
    xvfb = None
    platform_env = {"QT_QPA_PLATFORM": args.platform}
    if args.platform == "xcb" and not os.environ.get("DISPLAY"):
        try:
            xvfb = subprocess.Popen(["Xvfb", ":87", "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            parser.error("--platform xcb needs $DISPLAY or Xvfb (apt install xvfb)")
        time.sleep(1.0)
        platform_env["DISPLAY"] = ":87"
    if args.install:
        if deb is None:
            parser.error(f"no dist/{name}_*.deb to install; run 'make package' first")
        subprocess.run(["apt-get", "install", "-y", str(deb)], check=True, capture_output=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        installed_here = True
    try:
        exe = Path(args.exe) if args.exe else next(
            (p for p in (Path("/opt/hearth/hearth"), ROOT / "dist/pyinstaller/hearth/hearth") if p.exists()), None)
        if exe is None or not exe.exists():
            parser.error("no installed or built hearth found; run 'make package' (and install the .deb) or pass --exe")
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
        report: dict = {
            "machine": {"cpu": cpu,
                        "cores": os.cpu_count(), "os": platform.platform(), "python": platform.python_version()},
            "command": "python bench/package.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "exe": str(exe),
            "platform": args.platform,
            "variant": args.variant,
            "sizes": {
                "deb_bytes": deb.stat().st_size if deb else None, "deb": deb.name if deb else None,
                "tar_gz_bytes": tarball.stat().st_size if tarball else None, "tar_gz": tarball.name if tarball else None,
                "installed_bytes": tree_bytes(exe.resolve().parent),
                "model_bytes": tree_bytes(exe.resolve().parent / "_internal" / "model"),
            },
            "startup": {},
        }
        targets = {"installed": ([str(exe)], platform_env)}
        if not args.no_source:  # the same model, read from the bundle, run by the source tree's Python
            targets["source"] = ([sys.executable, "-m", "app.main"],
                                 {**platform_env, "HEARTH_BUNDLED_MODEL": str(exe.resolve().parent / "_internal" / "model")})
        for name, (command, extra_env) in targets.items():
            runs = []
            for _ in range(args.runs):
                runs.append(probe(command, cold=True, extra_env=extra_env))
                runs.append(probe(command, cold=False, extra_env=extra_env))
            by_cache = {c: [r for r in runs if r["cache"] == c] for c in ("cold", "warm")}
            report["startup"][name] = {c: summarize(rs) | {"runs": len(rs), "provider": rs[0]["provider"]}
                                       for c, rs in by_cache.items() if rs}
    finally:
        if installed_here:
            subprocess.run(["apt-get", "remove", "-y", name], check=False, capture_output=True)
        if xvfb is not None:
            xvfb.terminate()
            xvfb.wait(10)

    s = report["sizes"]
    print(f"machine: {report['machine']['cpu']}, {report['machine']['cores']} cores, {report['machine']['os']}; "
          f"Qt platform: {args.platform}")
    print(f"{'what':<40}{'size':>12}")
    for label, key in ((f"{s['deb']}", "deb_bytes"), (f"{s['tar_gz']}", "tar_gz_bytes"),
                       (f"installed ({exe.resolve().parent})", "installed_bytes"), ("  of which the model", "model_bytes")):
        if s[key] is not None:
            print(f"{label:<40}{s[key] / MB:>9.1f} MB")
    print()
    print(f"{'start-up (median of runs, min–max)':<40}{'cache':>6}{'interactive':>22}{'model ready':>22}  on")
    for name, caches in report["startup"].items():
        for cache, st in caches.items():
            i, m = st["interactive_ms"], st["model_ready_ms"]
            print(f"{name:<40}{cache:>6}{i['median']:>9.0f} ms ({i['min']:.0f}–{i['max']:.0f}){m['median']:>9.0f} ms "
                  f"({m['min']:.0f}–{m['max']:.0f})  {st['provider']}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = ("" if args.variant == "cpu" else "-gpu") + ("" if args.platform == "offscreen" else f"-{args.platform}")
    out = RESULTS / f"package{suffix}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
