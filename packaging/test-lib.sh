# Shared by packaging/test-install.sh (the installed .deb) and packaging/test-bundle.sh (an unpacked bundle):
# reporting, and the checks that use Hearth the way a user does. Source it; set RUN first: the command prefix
# that runs a Hearth executable by name (e.g. as an unprivileged user, or from the bundle's folder).
FAILED=0
say() { printf '%s\n' "$*"; }
pass() { say "  PASS  $*"; }
fail() { say "  FAIL  $*"; FAILED=1; }
check() {  # check "what" command...
  local what="$1"; shift
  if "$@" >/dev/null 2>&1; then pass "$what"; else fail "$what"; fi
}
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# check_resources INTERNAL: every file of the source tree's resources/ is in the bundle's _internal/resources.
check_resources() {
  local internal="$1" missing=""
  while IFS= read -r f; do
    [ -f "$internal/resources/$f" ] || missing="$missing $f"
  done < <(cd "$REPO/resources" && find . -type f ! -path '*/__pycache__/*' ! -name '*.pyc' | sed 's|^\./||' | sort)
  if [ -z "$missing" ]; then pass "every file of resources/ is in the bundle"; else fail "resources missing from the bundle:$missing"; fi
}

# self_test [ARGS...]: hearth --self-test offscreen; its report is printed indented.
self_test() {
  say "\$ QT_QPA_PLATFORM=offscreen hearth --self-test $*"
  local out rc
  out="$($RUN hearth --self-test "$@" 2>&1)"; rc=$?
  sed 's/^/    /' <<<"$out"
  if [ "$rc" = 0 ]; then pass "hearth --self-test exited 0"; else fail "hearth --self-test exited $rc"; fi
  SELF_TEST_OUT="$out"
}

# use_cli HOME PROVIDER: a stored conversation over two turns (the second resumed from its saved context),
# the saved context verified, the conversation printed. HOME is the data owner's home (for the file checks).
use_cli() {
  local home="$1" provider="$2" out
  say "\$ hearth-cli chat --conversation install-test --message 'Hello'   (user data, resumed next turn)"
  out="$($RUN hearth-cli --json chat --conversation install-test --message Hello --max-new-tokens 4 --greedy \
    --provider "$provider" 2>&1)"
  check "hearth-cli chat stores a conversation in ~/.local/share/hearth" test -s "$home/.local/share/hearth/conversations.sqlite3"
  check "the first turn saved its context" grep -q '"save": {"ok": true' <<<"$out"
  out="$($RUN hearth-cli --json chat --conversation install-test --message 'And again' --max-new-tokens 4 --greedy \
    --provider "$provider" 2>&1)"
  check_resumed "$(grep -o '"resume": {[^}]*}' <<<"$out")"
  check "hearth-cli kv verify --all: every saved context is valid" $RUN hearth-cli kv verify --all
  out="$($RUN hearth-cli --json conversations show install-test 2>&1)"
  check "hearth-cli conversations show install-test: four messages" grep -q '"message_count": 4' <<<"$out"
  # The packaged catalog knows the second model (offline: it names the fetch, it does not download).
  out="$($RUN hearth-cli generate --model gemma-3-270m --prompt Hi 2>&1)"
  check "the packaged catalog offers gemma-3-270m (hearth-cli names its fetch)" \
    grep -q "run 'hearth-cli model fetch gemma-3-270m' first" <<<"$out"
}

# check_resumed RESUME_JSON: the turn continued from its saved context on disk, or re-read it because that was
# estimated faster than restoring it (a few dozen tokens on a GPU: engine/checkpoint/adaptive.py).
check_resumed() {
  local resume="$1" source restore prefill
  source="$(sed -n 's/.*"source": "\([a-z]*\)".*/\1/p' <<<"$resume")"
  restore="$(sed -n 's/.*"restore_estimate_ms": \([0-9.]*\).*/\1/p' <<<"$resume")"
  prefill="$(sed -n 's/.*"prefill_estimate_ms": \([0-9.]*\).*/\1/p' <<<"$resume")"
  if [ "$source" = disk ]; then
    pass "the second turn resumed from the saved context on disk ($(sed -n 's/.*"restored_tokens": \([0-9]*\).*/\1/p' <<<"$resume") tokens)"
  elif [ "$source" = cold ] && [ -n "$restore" ] && [ -n "$prefill" ] && awk -v r="$restore" -v p="$prefill" 'BEGIN { exit !(p < r) }'; then
    pass "the second turn re-read its context: estimated faster (${prefill} ms) than restoring it (${restore} ms)"
  else
    fail "the second turn did not resume from its saved context: ${resume:-no resume report}"
  fi
}
