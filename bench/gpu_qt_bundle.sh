#!/bin/sh
# Packs the part of PySide6 the desktop window's GPU test needs (QtCore, QtGui, QtWidgets, QtNetwork, QtTest, the
# offscreen platform) with the system libraries they link and pytest-qt's wheel into .gpu/qt.tar.xz (~28 MB, one
# device call), for `sh bench/cuda_run.sh window`: the GPU machine has no Qt, no X libraries and no package index,
# and a whole PySide6 is 650 MB. Built from this machine's venv (PySide6's modules are abi3, so Python 3.12 loads
# them; the libraries come from an older glibc than the GPU machine's).
#
#   sh bench/gpu_qt_bundle.sh [venv]
set -eu
venv=${1:-.venv}
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/site/PySide6/Qt/lib" "$work/site/PySide6/Qt/plugins/platforms" "$work/sys"
cp -a "$site/shiboken6" "$work/site/"
rm -rf "$work/site/shiboken6/include" "$work/site/shiboken6/__pycache__"
(cd "$site/PySide6" && cp -a __init__.py _config.py _git_pyside_version.py support glue libpyside6.abi3.so.* \
    QtCore.abi3.so QtGui.abi3.so QtWidgets.abi3.so QtNetwork.abi3.so QtTest.abi3.so QtDBus.abi3.so "$work/site/PySide6/")
for lib in Core Gui Widgets Network Test DBus OpenGL; do cp -a "$site/PySide6/Qt/lib/libQt6$lib.so"* "$work/site/PySide6/Qt/lib/"; done
cp -a "$site/PySide6/Qt/lib/"libicu*.so* "$work/site/PySide6/Qt/lib/"
cp -a "$site/PySide6/Qt/plugins/platforms/libqoffscreen.so" "$site/PySide6/Qt/plugins/platforms/libqminimal.so" \
    "$work/site/PySide6/Qt/plugins/platforms/"
# the system libraries they link, but glibc's own and the C++ runtime (the GPU machine's are newer)
find "$work/site" -name '*.so*' -exec ldd {} \; 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\/(usr\/)?lib/ {print $3}' | sort -u \
    | grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt)\.so|ld-linux' \
    | while read -r lib; do cp -L "$lib" "$work/sys/"; done
"$venv/bin/pip" download -q --no-deps pytest-qt -d "$work"
mkdir -p .gpu
tar -C "$work" -cf - site sys $(cd "$work" && ls pytest_qt-*.whl) | xz -T2 -6 > .gpu/qt.tar.xz
ls -l .gpu/qt.tar.xz
