#!/usr/bin/env bash
# Install the .deb on this machine as a user would, use it, remove it, and check nothing is left but user data.
#
#   sudo packaging/test-install.sh [path/to/hearth_*.deb]      (default: the newest dist/hearth_*.deb)
#
# 1. apt install ./the.deb  2. check the files it put in place (every resource too)  3. as an unprivileged user
# (nobody, with a throwaway HOME): hearth --self-test offscreen (which imports every one of Hearth's modules), a
# CUDA request that must fall back to the CPU with a message, and a stored conversation over two turns, the second
# resumed from disk (user data)  4. the self-test as root too (catches any write under /opt/hearth)  5. apt
# remove  6. check /opt/hearth, /usr/bin/hearth*, the desktop entry and the icons are gone, the system
# directories are as before, and the user's conversation is still there.
# Needs root and a machine where installing a package is fine (CI containers, a VM). CI runs it after the test
# suite (packaging/ci-package.sh). Exits 0 only when every check passed.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEB="${1:-$(ls -t "$REPO"/dist/hearth_*.deb 2>/dev/null | head -1)}"
PKG=hearth
USER_HOME="$(mktemp -d /tmp/hearth-install-home.XXXXXX)"
# shellcheck source=packaging/test-lib.sh
. "$REPO/packaging/test-lib.sh"
RUN=as_user

as_user() {  # run as nobody with the throwaway HOME, none of root's environment, from /
  (cd / && setpriv --reuid=nobody --regid=nogroup --clear-groups env -i HOME="$USER_HOME" PATH=/usr/bin:/bin \
    QT_QPA_PLATFORM=offscreen LANG=C.UTF-8 "$@")
}
snapshot() {  # what the package may touch, minus caches that triggers rebuild
  find /opt /usr/bin /usr/share/applications /usr/share/icons/hicolor /usr/share/doc -maxdepth 4 \
       ! -name icon-theme.cache ! -name mimeinfo.cache 2>/dev/null | sort
}

[ "$(id -u)" = 0 ] || { say "test-install.sh: error: run as root (it installs and removes a package)"; exit 2; }
[ -f "$DEB" ] || { say "test-install.sh: error: no .deb found (build one with 'make package')"; exit 2; }
if dpkg-query -W -f='${Status}' "$PKG" 2>/dev/null | grep -q "ok installed"; then
  say "test-install.sh: error: $PKG is already installed; remove it first (apt remove $PKG)"; exit 2
fi
command -v setpriv >/dev/null || { say "test-install.sh: error: setpriv (util-linux) is missing"; exit 2; }
chown nobody:nogroup "$USER_HOME"

say "== Hearth install test — $(date -u '+%Y-%m-%d %H:%M UTC')"
say "package: $(basename "$DEB") ($(stat -c %s "$DEB") bytes); machine: $(. /etc/os-release; echo "$PRETTY_NAME"), $(uname -m), $(nproc) cores"
BEFORE="$(snapshot)"

say "== apt install"
start=$(now_ms)
if DEBIAN_FRONTEND=noninteractive apt-get install -y "$(realpath "$DEB")" >"$USER_HOME.apt-install.log" 2>&1; then
  pass "apt install ./$(basename "$DEB") ($(( ($(now_ms) - start) / 1000 )) s)"
else
  fail "apt install (log: $USER_HOME.apt-install.log)"; tail -20 "$USER_HOME.apt-install.log"; exit 1
fi
say "  installed size: $(du -sh /opt/hearth | cut -f1) in /opt/hearth ($(dpkg-query -W -f='${Installed-Size}' $PKG) KiB declared)"

say "== files in place"
check "/opt/hearth/hearth and hearth-cli are executable" test -x /opt/hearth/hearth -a -x /opt/hearth/hearth-cli
check "/usr/bin/hearth -> /opt/hearth/hearth" test "$(readlink /usr/bin/hearth)" = /opt/hearth/hearth
check "/usr/bin/hearth-cli -> /opt/hearth/hearth-cli" test "$(readlink /usr/bin/hearth-cli)" = /opt/hearth/hearth-cli
check "desktop entry /usr/share/applications/hearth.desktop" grep -q '^Exec=/usr/bin/hearth' /usr/share/applications/hearth.desktop
if command -v desktop-file-validate >/dev/null; then
  check "desktop-file-validate" desktop-file-validate /usr/share/applications/hearth.desktop
fi
check "hicolor icons (48, 256 px and scalable)" test -f /usr/share/icons/hicolor/48x48/apps/hearth.png \
  -a -f /usr/share/icons/hicolor/256x256/apps/hearth.png -a -f /usr/share/icons/hicolor/scalable/apps/hearth.svg
check_resources /opt/hearth/_internal
check "the bundled model is readable by everyone" as_user test -r \
  "$(find /opt/hearth/_internal/model -name model.onnx.data | head -1)"

say "== as an unprivileged user (nobody, HOME=$USER_HOME)"
self_test
check "the self-test imported every one of Hearth's modules" grep -q "ok  modules" <<<"$SELF_TEST_OUT"
if [ "$(uname -m)" = x86_64 ] && grep -q " on cpu ready in" <<<"$SELF_TEST_OUT"; then
  check "the packaged attention kernel ran (engine/native)" grep -q "attention kernel hearth" <<<"$SELF_TEST_OUT"
  check "the packaged output head ran from the table's blocks (engine/native)" grep -q "head hearth" <<<"$SELF_TEST_OUT"
fi
say "\$ hearth-cli generate --provider cuda --prompt 'Hi' --max-new-tokens 4 --greedy"
out="$(as_user hearth-cli generate --provider cuda --prompt Hi --max-new-tokens 4 --greedy --json 2>&1)"
say "    $(grep -v '^{' <<<"$out" | head -2)"
check "a CUDA request without CUDA runs on the CPU and says why" grep -q '"provider": "cpu".*CUDA was requested but cannot be used' <<<"$out"
use_cli "$USER_HOME" cpu
check "ONNX Runtime wrote no telemetry device id (ORT_DISABLE_TELEMETRY)" test ! -e "$USER_HOME/.cache/Microsoft"

say "== as root (any write under /opt/hearth would show up as a leftover below)"
root_out="$(cd / && env -i HOME="$USER_HOME.root" PATH=/usr/bin:/bin QT_QPA_PLATFORM=offscreen hearth --self-test 2>&1)" \
  && pass "hearth --self-test as root exited 0" || { fail "hearth --self-test as root"; say "$root_out"; }
rm -rf "$USER_HOME.root"

say "== apt remove"
if DEBIAN_FRONTEND=noninteractive apt-get remove -y "$PKG" >"$USER_HOME.apt-remove.log" 2>&1; then
  pass "apt remove -y $PKG"
else
  fail "apt remove (log: $USER_HOME.apt-remove.log)"; tail -20 "$USER_HOME.apt-remove.log"
fi
grep -i "not empty\|warning" "$USER_HOME.apt-remove.log" | sed 's/^/    /'
check "dpkg no longer lists $PKG as installed" bash -c "! dpkg-query -W -f='\${Status}' $PKG 2>/dev/null | grep -q 'ok installed'"
check "/opt/hearth is gone" test ! -e /opt/hearth
check "/usr/bin/hearth and /usr/bin/hearth-cli are gone" test ! -e /usr/bin/hearth -a ! -L /usr/bin/hearth -a ! -L /usr/bin/hearth-cli
check "the desktop entry is gone" test ! -e /usr/share/applications/hearth.desktop
check "no hearth icon is left in hicolor" test -z "$(find /usr/share/icons/hicolor -name 'hearth.*')"
AFTER="$(snapshot)"
if [ "$BEFORE" = "$AFTER" ]; then
  pass "/opt, /usr/bin, /usr/share/{applications,icons/hicolor,doc} are exactly as before the install"
else
  fail "system directories differ from before the install:"; diff <(echo "$BEFORE") <(echo "$AFTER") | sed 's/^/    /'
fi
check "the user's conversation is still there" test -s "$USER_HOME/.local/share/hearth/conversations.sqlite3"
say "  user data kept: $(cd "$USER_HOME" && find .local .cache -type f 2>/dev/null | sort | tr '\n' ' ')"

rm -rf "$USER_HOME" "$USER_HOME.apt-install.log" "$USER_HOME.apt-remove.log"
if [ "$FAILED" = 0 ]; then say "== RESULT: PASS"; else say "== RESULT: FAIL"; fi
exit "$FAILED"
