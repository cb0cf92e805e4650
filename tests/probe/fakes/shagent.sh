#!/bin/sh
# A small agent harness in POSIX sh (curl and jq), for the probe's tests. Its tools answer
# JSON, with "error": null when all went well; it offers bash, write and edit. --style:
#
#   jsonnull  starts a call by marking it in calls/ (synced), runs it, keeps the result in
#             its conversation (messages.json, replaced atomically and synced). A call
#             marked and never finished is answered, on resume,
#             {"status": "interrupted", "error": null, ...}: it never runs twice.
#   madeup    records {"exit_code": 0, "error": null} as a call's result before it runs
#             it, and on resume shows whatever it recorded: a success it made up.
#   mute      as jsonnull, but its bash never passes the command's output on.
#
# Usage: sh shagent.sh --style S --model-url URL --state DIR [--prompt P] [--resume]
set -eu
style=jsonnull url="" state="" prompt="go"
while [ $# -gt 0 ]; do
  case $1 in
    --style) style=$2; shift 2 ;;
    --model-url) url=$2; shift 2 ;;
    --state) state=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    *) shift ;;
  esac
done
msgs=$state/messages.json
calls=$state/calls
mkdir -p "$calls"

save() { # the conversation, replaced atomically, durable before anything goes on
  printf '%s\n' "$1" > "$msgs.new"
  sync "$msgs.new"
  mv "$msgs.new" "$msgs"
  sync "$state"
}

tools='[
 {"type":"function","function":{"name":"bash","parameters":{"type":"object","properties":{"command":{"type":"string"}}}}},
 {"type":"function","function":{"name":"write","parameters":{"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"}}}}},
 {"type":"function","function":{"name":"edit","parameters":{"type":"object","properties":{"path":{"type":"string"},"old":{"type":"string"},"new":{"type":"string"}}}}}
]'

run() { # $1: a tool call (JSON) -> the result's text
  name=$(printf '%s' "$1" | jq -r .function.name)
  args=$(printf '%s' "$1" | jq -r .function.arguments)
  case $name in
    bash)
      cmd=$(printf '%s' "$args" | jq -r .command)
      rc=0
      out=$(/bin/sh -c "$cmd" 2>&1) || rc=$?
      if [ "$style" = mute ]; then out=""; fi
      jq -cn --arg out "$out" --argjson rc "$rc" '{exit_code: $rc, error: null, stdout: $out}' ;;
    write)
      p=$(printf '%s' "$args" | jq -r .path)
      printf '%s' "$args" | jq -j .content > "$p"
      echo '{"ok": true, "error": null}' ;;
    edit)
      p=$(printf '%s' "$args" | jq -r .path)
      if jq -Rrsj --argjson a "$args" '(index($a.old)) as $i | if $i == null then error("old text not found") else .[:$i] + $a.new + .[$i + ($a.old | length):] end' "$p" > "$p.edit" 2>/dev/null; then
        mv "$p.edit" "$p"
        echo '{"ok": true, "error": null}'
      else
        rm -f "$p.edit"
        echo '{"ok": false, "error": "old text not found"}'
      fi ;;
    *) echo '{"ok": false, "error": "no such tool"}' ;;
  esac
}

[ -f "$msgs" ] || save "$(jq -cn --arg p "$prompt" '[{role: "user", content: $p}]')"
m=$(cat "$msgs")
# the calls of the last assistant message without a result yet
pending=$(printf '%s' "$m" | jq -c '(map(.role) | rindex("assistant")) as $i
  | if $i == null then [] else (.[$i + 1:] | map(.tool_call_id)) as $done
    | [.[$i].tool_calls[]? | select(.id as $id | $done | index($id) | not)] end')
while :; do
  n=$(printf '%s' "$pending" | jq length)
  i=0
  while [ "$i" -lt "$n" ]; do
    call=$(printf '%s' "$pending" | jq -c ".[$i]")
    id=$(printf '%s' "$call" | jq -r .id | tr -c 'A-Za-z0-9_-' _)
    if [ -f "$calls/$id.result" ]; then
      result=$(cat "$calls/$id.result") # madeup: what it recorded before running
    elif [ -f "$calls/$id" ]; then
      result='{"status": "interrupted", "error": null, "note": "the agent restarted during this call"}'
    else
      : > "$calls/$id"
      if [ "$style" = madeup ]; then
        echo '{"exit_code": 0, "error": null}' > "$calls/$id.result"
        sync "$calls/$id.result"
      fi
      sync "$calls"
      result=$(run "$call")
    fi
    m=$(printf '%s' "$m" | jq -c --arg id "$(printf '%s' "$call" | jq -r .id)" --arg r "$result" \
      '. + [{role: "tool", tool_call_id: $id, content: $r}]')
    save "$m"
    i=$((i + 1))
  done
  body=$(jq -cn --argjson m "$m" --argjson t "$tools" '{model: "fake", messages: $m, tools: $t}')
  reply=$(printf '%s' "$body" | curl -sS --fail -X POST -H 'content-type: application/json' \
    --data-binary @- "$url/chat/completions")
  msg=$(printf '%s' "$reply" | jq -c '.choices[0].message | {role: "assistant", content, tool_calls}
    | if .tool_calls == null then del(.tool_calls) else . end')
  m=$(printf '%s' "$m" | jq -c --argjson x "$msg" '. + [$x]')
  save "$m"
  pending=$(printf '%s' "$msg" | jq -c '.tool_calls // []')
  [ "$(printf '%s' "$pending" | jq length)" -gt 0 ] || exit 0
done
