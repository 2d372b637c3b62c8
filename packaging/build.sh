#!/usr/bin/env bash
# Build Hearth's Linux packages: the PyInstaller one-folder bundle with the converted model, a .deb and a .tar.gz.
#
#   packaging/build.sh            (what `make package` runs; VARIANT=gpu for the GPU build)
#
# Environment: VARIANT (cpu|gpu, default cpu), PKG_VENV (the build venv, default build/venv-$VARIANT; created and
# filled from packaging/requirements-$VARIANT.txt when missing), PYTHON (the interpreter that creates it,
# default python3), MODEL_FROM (a data dir that already holds the model and its conversion; by default the
# staging script looks in $HEARTH_HOME, .test-cache/home and the user cache, else fetches and converts).
# Outputs: dist/hearth[-gpu]_<version>_<arch>.deb, dist/hearth[-gpu]-<version>-linux-<machine>.tar.gz and
# dist/pyinstaller/hearth/ (the bundle). Intermediate files go to build/.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
VARIANT="${VARIANT:-cpu}"
PKG_VENV="${PKG_VENV:-build/venv-$VARIANT}"
PYTHON="${PYTHON:-python3}"
case "$VARIANT" in
  # The CPU build ships the int4 conversion and the GGUF's metadata (tokenizer, template), not the GGUF's weights.
  cpu) WEIGHTS="int4"; STAGE_FLAGS=""; NAME="hearth" ;;
  # On CUDA int4 runs as int4-cuda-dense (engine/model/precision.py: cuda_variant): ship both, and the GGUF so any
  # other precision or CUDA variant can still be converted offline.
  gpu) WEIGHTS="int4 int4-cuda-dense"; STAGE_FLAGS="--full-gguf"; NAME="hearth-gpu" ;;
  *) echo "build.sh: error: VARIANT must be cpu or gpu, not '$VARIANT'" >&2; exit 2 ;;
esac
# Tools and the system libraries the .deb depends on, checked before anything is built (installed when root).
"$PYTHON" packaging/prereqs.py --install || exit 1
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)"
step() { printf '\n== %s (%(%T)T)\n' "$1" -1; }

step "build venv $PKG_VENV"
REQS="packaging/requirements-$VARIANT.txt"
if [ ! -x "$PKG_VENV/bin/pyinstaller" ]; then
  "$PYTHON" -m venv "$PKG_VENV"
  "$PKG_VENV/bin/pip" install -q --upgrade pip
fi
# A venv built from an older requirements file is brought up to date (a package added later was missing from
# the bundle, and only its smoke test said so).
if [ "$(cat "$PKG_VENV/requirements.sha256" 2>/dev/null)" != "$(sha256sum "$REQS" | cut -d' ' -f1)" ]; then
  "$PKG_VENV/bin/pip" install -q -r "$REQS"
  sha256sum "$REQS" | cut -d' ' -f1 > "$PKG_VENV/requirements.sha256"
fi
PY="$PKG_VENV/bin/python"

step "stage the model ($WEIGHTS)"
# shellcheck disable=SC2086
"$PY" packaging/stage_model.py "build/model-$VARIANT" --weights $WEIGHTS $STAGE_FLAGS ${MODEL_FROM:+--from "$MODEL_FROM"}

step "icons"
"$PY" packaging/render_icons.py build/icons

step "PyInstaller"
rm -rf dist/pyinstaller/hearth
HEARTH_PKG_VARIANT="$VARIANT" "$PKG_VENV/bin/pyinstaller" --noconfirm --log-level WARN \
  --distpath dist/pyinstaller --workpath "build/pyinstaller-$VARIANT" packaging/hearth.spec
BUNDLE="dist/pyinstaller/hearth"
cp -a "build/model-$VARIANT" "$BUNDLE/_internal/model"  # -a keeps a shipped GGUF's mtime, which its hash sidecar records
# The interpreter and its own extension modules carry debug symbols (~18 MB). Only these are stripped: stripping
# auditwheel-patched wheel libraries (numpy's OpenBLAS) breaks them, and the wheels' Qt and ORT come stripped.
if [ "$(uname -s)" = Linux ]; then
  find "$BUNDLE/_internal" -maxdepth 1 -name 'libpython3*.so*' -type f -exec strip --strip-unneeded {} +
  find "$BUNDLE/_internal/python3"*/lib-dynload -name '*.so' -type f -exec strip --strip-unneeded {} + 2>/dev/null || true
fi
chmod -R u=rwX,go=rX "$BUNDLE"

step "smoke test of the bundle"
QT_QPA_PLATFORM=offscreen "$BUNDLE/hearth" --help >/dev/null
"$BUNDLE/hearth-cli" generate --prompt "Hello" --max-new-tokens 2 --greedy --provider cpu --data-dir "build/smoke-home" >/dev/null
rm -rf build/smoke-home

step ".deb"
DEB="$(VERSION="$VERSION" NAME="$NAME" VARIANT="$VARIANT" packaging/make_deb.sh "$BUNDLE" build/icons)"

step ".tar.gz"
ARCHIVE="dist/$NAME-$VERSION-linux-$(uname -m).tar.gz"
STAGE="build/tar/$NAME-$VERSION"
rm -rf build/tar && mkdir -p "$STAGE"
cp -a "$BUNDLE/." "$STAGE/"
mkdir -p "$STAGE/share/applications" "$STAGE/share/icons"
cp -a build/icons "$STAGE/share/icons/hicolor"
sed "s|^Exec=.*|Exec=hearth %U|; s|^TryExec=.*|TryExec=hearth|" packaging/linux/hearth.desktop > "$STAGE/share/applications/hearth.desktop"
cp packaging/linux/README-tarball.txt "$STAGE/README.txt"
tar -C build/tar -czf "$ARCHIVE" "$NAME-$VERSION"
rm -rf build/tar  # a second copy of the bundle; CI machines can be short of disk

step "done"
ls -l "$DEB" "$ARCHIVE"
