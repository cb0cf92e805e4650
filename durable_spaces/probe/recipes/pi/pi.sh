#!/bin/sh
# The `pi` recipe's program: the Pi coding agent (npm @mariozechner/pi-coding-agent), run
# non-interactively as its docs show, pointed at the model server by a models.json
# provider (api "openai-completions"). Its own tools: bash, write, edit.
#
#   pi.sh check                                  where pi is, its version (exit 1: none)
#   pi.sh launch MODEL_URL STATE_DIR PROMPT      pi -p PROMPT
#   pi.sh resume MODEL_URL STATE_DIR             pi -p -c "continue": the latest session
#
# Pi is looked for where images/probe/ci-setup.sh installs it, then on PATH. Everything
# Pi keeps lives under STATE_DIR: its agent dir (models.json, settings: pi/), its home
# (home/) and its sessions (sessions/: JSON lines, one file per session).
set -eu
find_pi() {
  local_pi="${XDG_CACHE_HOME:-$HOME/.cache}/durable-spaces/probe/npm/node_modules/.bin/pi"
  if [ -x "$local_pi" ]; then echo "$local_pi"; return 0; fi
  command -v pi 2>/dev/null || return 1
}
if ! PI=$(find_pi); then
  echo "pi: not installed (run images/probe/ci-setup.sh)" >&2
  exit 1
fi
what=$1
if [ "$what" = check ]; then
  echo "$PI $("$PI" --version 2>&1 | tail -n 1)"
  exit 0
fi
url=$2
state=$3
mkdir -p "$state/pi" "$state/home" "$state/sessions"
# The provider: "fake" at the model server; no developer role, no reasoning effort.
cat > "$state/pi/models.json" <<JSON
{"providers": {"fake": {"baseUrl": "$url", "api": "openai-completions", "apiKey": "dummy",
  "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
  "models": [{"id": "fake-model"}]}}}
JSON
export HOME="$state/home" PI_CODING_AGENT_DIR="$state/pi" PI_OFFLINE=1 PI_TELEMETRY=0
set -- "$PI" -p --provider fake --model fake-model --session-dir "$state/sessions"
case "$what" in
  launch) exec "$@" "$4" </dev/null ;;
  resume) exec "$@" -c "continue" </dev/null ;;
  *) echo "pi.sh: launch, resume or check, not $what" >&2; exit 2 ;;
esac
