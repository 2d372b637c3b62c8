#!/usr/bin/env bash
# What .ci/run does after the test suite: build the CPU package and prove it installs and runs, so that a
# dependency PyInstaller missed, a resource not collected or a model file not staged fails CI, not a user's
# install. The model is the one the tests already fetched and converted (.test-cache/home; nothing is
# converted twice), and the build venv is made from packaging/requirements-cpu.txt.
#
#   packaging/ci-package.sh
#
# As root (CI's containers): make package, then packaging/test-install.sh (apt install, use as an unprivileged
# user, apt remove). Not root: make package still runs when its prerequisites are installed (else prereqs.py
# names them and this fails), and the .tar.gz is tested unpacked (packaging/test-bundle.sh) instead.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
started=$(date +%s)
step() { printf '\n== ci-package: %s (%(%T)T, %d s in)\n' "$1" -1 $(( $(date +%s) - started )); }

step "make package"
make package || { echo "ci-package: error: make package failed" >&2; exit 1; }
DEB="$(ls -t dist/hearth_*.deb | head -1)"
ARCHIVE="$(ls -t dist/hearth-*-linux-*.tar.gz | head -1)"
if [ "$(id -u)" = 0 ]; then
  # CI machines can be short of disk: drop what the install test does not need (the build venv, PyInstaller's
  # work files, the unpacked bundle and the .tar.gz, all rebuilt by the next make package), then check that
  # what the .deb unpacks to fits before apt half-installs it.
  rm -rf build/venv-cpu build/pyinstaller-cpu dist/pyinstaller "$ARCHIVE"
  need_kb=$(( $(dpkg-deb -f "$DEB" Installed-Size) + 100 * 1024 ))
  free_kb=$(df -Pk /opt | awk 'NR == 2 { print $4 }')
  if [ "$free_kb" -lt "$need_kb" ]; then
    echo "ci-package: error: the install test needs $(( need_kb / 1024 )) MB free under /opt; there are $(( free_kb / 1024 )) MB" >&2
    df -h / /opt /tmp >&2
    exit 1
  fi
  step "install test of $DEB ($(( free_kb / 1024 )) MB free under /opt)"
  packaging/test-install.sh "$DEB" || { echo "ci-package: error: the install test failed" >&2; exit 1; }
else
  step "bundle test of $ARCHIVE (not root: the .deb is not installed)"
  packaging/test-bundle.sh "$ARCHIVE" || { echo "ci-package: error: the bundle test failed" >&2; exit 1; }
fi
step "done"
