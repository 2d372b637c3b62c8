"""Check (and, as root on Debian/Ubuntu, install) what ``make package`` needs before it builds anything.

    python3 packaging/prereqs.py [--install] [--deps FILE]

The packages are listed in packaging/build-deps.txt: the build tools and the system libraries the bundle
links to (the .deb depends on them, so they must be installed where it is built). Without them a build
used to stop after a minute and a half naming a missing library; now it stops at once with the one
``apt install`` line, or installs them itself when run as root with ``--install`` (what build.sh does).
Exit 0 when everything is there (or was installed), 1 otherwise. Uses only the standard library.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

DEPS = Path(__file__).with_name("build-deps.txt")


def read_deps(path: Path) -> list[str]:
    names = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


def missing(packages: list[str]) -> list[str]:
    """The packages dpkg does not report as installed."""
    absent = []
    for name in packages:
        proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not proc.stdout.endswith("install ok installed"):
            absent.append(name)
    return absent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--install", action="store_true", help="as root with apt-get: install what is missing")
    parser.add_argument("--deps", type=Path, default=DEPS, help="the package list (default: %(default)s)")
    args = parser.parse_args(argv)
    if shutil.which("dpkg-query") is None:
        print("prereqs: not a Debian/Ubuntu system (no dpkg-query); the .deb can only be built on one. Packages "
              f"needed: {' '.join(read_deps(args.deps))}", file=sys.stderr)
        return 1
    absent = missing(read_deps(args.deps))
    if not absent:
        return 0
    line = "apt install " + " ".join(absent)
    if args.install and os.geteuid() == 0 and shutil.which("apt-get"):
        print(f"prereqs: installing what the build needs: {' '.join(absent)}", file=sys.stderr)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "--no-install-recommends", *absent]
        done = subprocess.run(install, env=env, check=False)
        if done.returncode != 0:  # a fresh container often has no package lists yet
            print("prereqs: apt-get install failed; updating the package lists and trying again", file=sys.stderr)
            subprocess.run(["apt-get", "update"], env=env, check=False)
            done = subprocess.run(install, env=env, check=False)
        if done.returncode == 0 and not missing(absent):
            return 0
        print(f"prereqs: error: apt-get could not install them; try: {line}", file=sys.stderr)
        return 1
    print(f"prereqs: error: the build needs these packages; install them with:\n    sudo {line}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
