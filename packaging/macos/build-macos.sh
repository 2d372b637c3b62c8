#!/usr/bin/env bash
# macOS: Hearth.app and a .dmg. UNTESTED HERE: written for issue 7 on Linux, never run on a Mac — see
# packaging/README.md ("macOS") for what to check first.
#
#   packaging/macos/build-macos.sh        (on macOS 12+, Xcode command line tools, Python 3.11 from python.org)
#
# → dist/pyinstaller/Hearth.app and dist/hearth-<version>-macos-<arch>.dmg. Set CODESIGN_ID="Developer ID
# Application: …" to sign (then notarize with `xcrun notarytool submit … --wait` and `xcrun stapler staple`).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
[ "$(uname -s)" = Darwin ] || { echo "build-macos.sh: error: run this on macOS" >&2; exit 1; }
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)"
PKG_VENV="${PKG_VENV:-build/venv-macos}"
if [ ! -x "$PKG_VENV/bin/pyinstaller" ]; then
  python3.11 -m venv "$PKG_VENV"
  "$PKG_VENV/bin/pip" install -q -r packaging/requirements-cpu.txt   # onnxruntime on macOS is the CPU (and CoreML) build
fi
PY="$PKG_VENV/bin/python"

"$PY" packaging/stage_model.py build/model-macos --weights int4
"$PY" packaging/render_icons.py build/icons
ICONSET=build/hearth.iconset
rm -rf "$ICONSET" && mkdir -p "$ICONSET"
for n in 16 32 128 256 512; do
  cp "build/icons/${n}x${n}/apps/hearth.png" "$ICONSET/icon_${n}x${n}.png"
done
for n in 16 32 128 256; do
  cp "build/icons/$((n * 2))x$((n * 2))/apps/hearth.png" "$ICONSET/icon_${n}x${n}@2x.png" 2>/dev/null || true
done
iconutil -c icns "$ICONSET" -o packaging/macos/hearth.icns

HEARTH_PKG_VARIANT=cpu "$PKG_VENV/bin/pyinstaller" --noconfirm --distpath dist/pyinstaller \
  --workpath build/pyinstaller-macos packaging/hearth.spec
APP=dist/pyinstaller/Hearth.app
# Data belongs in Contents/Resources (code signing wants only code in Frameworks); the app finds its model at
# sys._MEIPASS/model, and sys._MEIPASS is Contents/Frameworks, so a link points there.
cp -R build/model-macos "$APP/Contents/Resources/model"
ln -s ../Resources/model "$APP/Contents/Frameworks/model"

if [ -n "${CODESIGN_ID:-}" ]; then
  codesign --deep --force --options runtime --timestamp --sign "$CODESIGN_ID" "$APP"
fi
QT_QPA_PLATFORM=offscreen "$APP/Contents/MacOS/hearth" --self-test

STAGE=build/dmg && rm -rf "$STAGE" && mkdir -p "$STAGE"
cp -R "$APP" "$STAGE/"
ln -s /Applications "$STAGE/Applications"
DMG="dist/hearth-$VERSION-macos-$(uname -m).dmg"
hdiutil create -volname "Hearth $VERSION" -srcfolder "$STAGE" -format UDZO -imagekey zlib-level=9 -ov "$DMG"
echo "$DMG"
