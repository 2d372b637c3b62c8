"""The Debian packages a PyInstaller bundle needs from the system, read from its ELF files.

Every ELF file's DT_NEEDED entries (``readelf -d``) that the bundle does not itself provide are resolved
with ``ldconfig -p`` and mapped to their package with ``dpkg -S``. Libraries needed only by optional parts (the
GTK platform theme, which Qt skips when GTK is absent; the GPU build's CUDA providers) become Recommends when a
package provides them, and are left out otherwise.

    python packaging/deb_depends.py BUNDLE_DIR     →  prints "Depends: …" and "Recommends: …"
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

OPTIONAL = (
    "platformthemes/libqgtk3.so",  # loaded only when GTK is on the desktop
    # onnxruntime-gpu's providers: CUDA 13 and cuDNN 9 come from NVIDIA's repository, not Debian's (README.md)
    "libonnxruntime_providers_cuda.so", "libonnxruntime_providers_tensorrt.so",
)
# essential on every Debian system (dpkg itself needs it)
IMPLICIT = {"libc6"}


def is_elf(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


def needed(path: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=False).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def system_paths() -> dict[str, str]:
    """soname → path for the host architecture, from the dynamic linker's cache."""
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    found: dict[str, str] = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
        if m and "," in m.group(2):  # "(libc6,x86-64)"; 32-bit entries read "(libc6)"
            found.setdefault(m.group(1), m.group(3))
    return found


def package_of(path: str) -> str | None:
    for candidate in (path, str(Path(path).resolve())):
        for variant in (candidate, candidate.replace("/usr/lib/", "/lib/", 1), candidate.replace("/lib/", "/usr/lib/", 1)):
            proc = subprocess.run(["dpkg", "-S", variant], capture_output=True, text=True, check=False)
            if proc.returncode == 0:
                return proc.stdout.split(":", 1)[0].strip()
    return None


def depends(bundle: Path) -> tuple[list[str], list[str], list[str]]:
    """(Depends, Recommends, sonames nobody provides)."""
    files = [p for p in bundle.rglob("*") if p.is_file() and not p.is_symlink() and is_elf(p)]
    provided = {p.name for p in bundle.rglob("*")}
    wanted: dict[str, bool] = {}  # soname → needed by something that is not optional
    for f in files:
        optional = any(str(f).endswith(o) for o in OPTIONAL)
        for soname in needed(f):
            if soname not in provided:
                wanted[soname] = wanted.get(soname, False) or not optional
    paths = system_paths()
    required: set[str] = set()
    recommended: set[str] = set()
    missing: list[str] = []
    for soname, hard in sorted(wanted.items()):
        pkg = package_of(paths[soname]) if soname in paths else None
        if pkg is None:
            (missing if hard else []).append(soname)
            continue
        pkg = pkg.split(":")[0]
        (required if hard else recommended).add(pkg)
    required -= IMPLICIT
    return sorted(required), sorted(recommended - required - IMPLICIT), missing


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("usage: deb_depends.py BUNDLE_DIR", file=sys.stderr)
        return 2
    required, recommended, missing = depends(Path(args[0]))
    if missing:
        print(f"deb_depends: error: no installed package provides {', '.join(missing)}; install the libraries "
              "on the build machine so their packages can be named", file=sys.stderr)
        return 1
    print("Depends: " + ", ".join(required))
    print("Recommends: " + ", ".join(recommended))
    return 0


if __name__ == "__main__":
    sys.exit(main())
