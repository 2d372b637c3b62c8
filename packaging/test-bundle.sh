#!/usr/bin/env bash
# Use an unpacked Hearth bundle (the .tar.gz, or dist/pyinstaller/hearth) the way a user does, without
# installing anything: where the .deb cannot be installed (no root, no apt: the GPU machine), or before it is.
#
#   packaging/test-bundle.sh BUNDLE_DIR_OR_TARBALL [--provider cpu|cuda] [--keep-home DIR]
#
# Checks: every resource is in the bundle; hearth --self-test offscreen (which imports every one of Hearth's
# modules) on the provider; hearth-cli generate runs on that provider (for cuda: on CUDA, not a fallback); a
# stored conversation over two turns, the second resumed from disk; kv verify --all; the conversation printed.
# Everything runs with a throwaway HOME (kept in DIR with --keep-home, e.g. to restore its saved context
# elsewhere). Exits 0 only when every check passed.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=packaging/test-lib.sh
. "$REPO/packaging/test-lib.sh"
usage() { say "usage: packaging/test-bundle.sh BUNDLE_DIR_OR_TARBALL [--provider cpu|cuda] [--keep-home DIR]"; exit 2; }
[ $# -ge 1 ] || usage
SOURCE="$1"; shift
PROVIDER=cpu; KEEP=""
while [ $# -gt 0 ]; do
  case "$1" in
    --provider) PROVIDER="${2:-}"; shift 2 ;;
    --keep-home) KEEP="${2:-}"; shift 2 ;;
    *) usage ;;
  esac
done
case "$PROVIDER" in cpu|cuda) ;; *) say "test-bundle.sh: error: --provider must be cpu or cuda, not '$PROVIDER'"; exit 2 ;; esac

SCRATCH="$(mktemp -d /tmp/hearth-bundle-test.XXXXXX)"
trap 'rm -rf "$SCRATCH"' EXIT
if [ -f "$SOURCE" ]; then
  start=$(now_ms)
  tar -C "$SCRATCH" -xzf "$SOURCE" || { say "test-bundle.sh: error: cannot unpack $SOURCE"; exit 2; }
  BUNDLE="$(dirname "$(find "$SCRATCH" -maxdepth 2 -name hearth-cli -type f | head -1)")"
  say "unpacked $(basename "$SOURCE") ($(stat -c %s "$SOURCE") bytes) in $(( ($(now_ms) - start) / 1000 )) s"
else
  BUNDLE="$(cd "$SOURCE" 2>/dev/null && pwd)"
fi
[ -n "$BUNDLE" ] && [ -x "$BUNDLE/hearth" ] && [ -x "$BUNDLE/hearth-cli" ] \
  || { say "test-bundle.sh: error: no hearth and hearth-cli executables in $SOURCE"; exit 2; }
if [ -n "$KEEP" ]; then USER_HOME="$KEEP"; mkdir -p "$USER_HOME"; else USER_HOME="$SCRATCH/home"; mkdir -p "$USER_HOME"; fi
in_bundle() {  # the bundle's executables first on PATH, a throwaway HOME, none of the caller's environment
  (cd / && env -i HOME="$USER_HOME" PATH="$BUNDLE:/usr/bin:/bin" QT_QPA_PLATFORM=offscreen LANG=C.UTF-8 \
    ${LD_LIBRARY_PATH:+LD_LIBRARY_PATH="$LD_LIBRARY_PATH"} "$@")
}
RUN=in_bundle

say "== Hearth bundle test — $(date -u '+%Y-%m-%d %H:%M UTC')"
say "bundle: $BUNDLE ($(du -sh "$BUNDLE" | cut -f1)); provider: $PROVIDER; machine: $(. /etc/os-release; echo "$PRETTY_NAME"), $(uname -m), $(nproc) cores"
check_resources "$BUNDLE/_internal"
self_test --provider "$PROVIDER"
check "the self-test imported every one of Hearth's modules" grep -q "ok  modules" <<<"$SELF_TEST_OUT"
check "the self-test ran on $PROVIDER" grep -q " on $PROVIDER ready in" <<<"$SELF_TEST_OUT"
if [ "$PROVIDER" = cpu ] && [ "$(uname -m)" = x86_64 ]; then
  check "the bundled attention kernel ran (engine/native)" grep -q "attention kernel hearth" <<<"$SELF_TEST_OUT"
  check "the bundled output head ran from the table's blocks (engine/native)" grep -q "head hearth" <<<"$SELF_TEST_OUT"
fi
say "\$ hearth-cli generate --provider $PROVIDER --prompt 'Hi' --max-new-tokens 8 --greedy"
start=$(now_ms)
out="$(in_bundle hearth-cli generate --provider "$PROVIDER" --prompt Hi --max-new-tokens 8 --greedy --json 2>&1)"
say "    $(( $(now_ms) - start )) ms, process start to exit; $(grep -o '"provider": "[a-z]*"' <<<"$out")$(grep -v '^{' <<<"$out" | head -2 | sed 's/^/; /')"
check "hearth-cli generate ran on $PROVIDER" grep -q "\"provider\": \"$PROVIDER\"" <<<"$out"
if grep -q "cannot be used" <<<"$out"; then fail "it fell back: $(grep -o '[^"]*cannot be used[^"]*' <<<"$out" | head -1)"; else pass "no fallback"; fi
use_cli "$USER_HOME" "$PROVIDER"

if [ "$FAILED" = 0 ]; then say "== RESULT: PASS"; else say "== RESULT: FAIL"; fi
exit "$FAILED"
