# shellcheck shell=bash
# The CI campaign subset's functions (sourced by .ci/campaigns.sh, and by tests/ci/ which
# runs them against stand-in campaigns). A campaign passes only if it exits 0 AND its
# SUMMARY line (the last line it prints) says it ran and its kills landed: belt and
# braces beside the exit code (campaigns/earned.py), so a campaign command that lies or a
# SUMMARY that was doctored fails the job too. A capability the subset needs that is
# missing (durable_spaces/campaigns/capabilities.py) is skipped with its reason outside
# CI and fails the job on CI (CI=true). docs/lab-exit-codes.md says all of it.

# Where the campaigns write (each its own directory), and how they are run: a test puts a
# stand-in command here.
ci_out=${CI_CAMPAIGNS_OUT:-campaigns-out/ci}
ci_campaign_cmd=${CI_CAMPAIGN_CMD:-durable-spaces campaign}
# Of the kills a campaign planned, at least this many percent must land (and one): the
# default of campaigns/earned.py's Tolerance.min_kill_fraction.
ci_min_kill_percent=${CI_MIN_KILL_PERCENT:-5}
# What says whether this machine has a capability (a test puts a stand-in here).
ci_capabilities_cmd=${CI_CAPABILITIES_CMD:-python -m durable_spaces.campaigns.capabilities}
ci_status=0
ci_failed=()

ci_fail() {  # NAME REASON: the job fails, NAME is named again at the end
  echo "== FAILED $1: $2"
  ci_status=1
  ci_failed+=("$1:$2")
}

ci_is_ci() {
  case "${CI:-}" in true | TRUE | True | 1 | yes) return 0 ;; *) return 1 ;; esac
}

# ci_require GROUP CAPABILITY...: 0 when this machine has them all. Otherwise the group
# is skipped with the reason, and on CI the job fails with it.
ci_require() {
  local group=$1 why
  shift
  # shellcheck disable=SC2086  # the command is words
  if why=$($ci_capabilities_cmd "$@" 2>&1); then
    return 0
  fi
  why=$(echo "$why" | tr '\n' ';' | sed 's/;$//')
  if ci_is_ci; then
    ci_fail "$group" "CI requires it, and it is missing: $why"
  else
    echo "== $group campaigns skipped: $why"
  fi
  return 1
}

# ci_check_summary NAME FILE RC: what FILE (the campaign's stdout) says, checked apart
# from its exit code RC. Prints the reason and returns 1 when it does not hold.
ci_check_summary() {
  local name=$1 file=$2 rc=$3 line k kv
  line=$(grep -v '^[[:space:]]*$' "$file" | tail -n 1)
  if [[ $line != "SUMMARY "* ]]; then
    echo "no SUMMARY line last (last line: ${line:0:200})"
    return 1
  fi
  local -A f=()
  local -a words
  read -ra words <<<"${line#SUMMARY }"
  for kv in "${words[@]}"; do
    k=${kv%%=*}
    f[$k]=${kv#*=}
  done
  for k in runs ok failed lab_errors kills planned_kills; do
    if ! [[ ${f[$k]:-} =~ ^[0-9]+$ ]]; then
      echo "SUMMARY field $k is missing or not a count: ${line:0:300}"
      return 1
    fi
  done
  if [ -z "${f[faults]:-}" ]; then
    echo "SUMMARY field faults is missing: ${line:0:300}"
    return 1
  fi
  if ((f[ok] + f[failed] + f[lab_errors] != f[runs])); then
    echo "SUMMARY ok+failed+lab_errors is not runs: ${line:0:300}"
    return 1
  fi
  if ((f[runs] == 0)); then
    echo "runs=0: the campaign ran nothing"
    return 1
  fi
  if ((f[kills] == 0)) && [ "${f[faults]:-}" = - ]; then
    echo "no fault landed (kills=0 faults=-): the campaign tested no recovery"
    return 1
  fi
  if ((rc == 0 && (f[failed] > 0 || f[lab_errors] > 0))); then
    echo "exit 0 but the SUMMARY counts failed=${f[failed]} lab_errors=${f[lab_errors]}"
    return 1
  fi
  local need=$(((f[planned_kills] * ci_min_kill_percent + 99) / 100))
  ((f[planned_kills] > 0 && need < 1)) && need=1
  if ((f[kills] < need)); then
    echo "kills=${f[kills]} short of planned_kills=${f[planned_kills]} (at least $need must land)"
    return 1
  fi
  # An exhaustive campaign kills at every failpoint its uninterrupted run passed, but
  # those chaos/points.py names not killable: killed_at=K/N, K of those N.
  if [ -n "${f[killed_at]+set}" ]; then
    if ! [[ ${f[killed_at]} =~ ^([0-9]+)/([0-9]+)$ ]]; then
      echo "SUMMARY field killed_at is not K/N: ${line:0:300}"
      return 1
    fi
    if ((BASH_REMATCH[1] != BASH_REMATCH[2])); then
      echo "killed at ${BASH_REMATCH[1]} of the ${BASH_REMATCH[2]} killable failpoints its uninterrupted run passed"
      return 1
    fi
  fi
  return 0
}

# ci_run NAME ARGS...: one campaign into $ci_out/NAME; its output shown and kept.
ci_run() {
  local name=$1 rc errexit=0 why
  shift
  echo "== campaign $name"
  mkdir -p "$ci_out"
  [[ $- == *e* ]] && errexit=1
  set +e
  # shellcheck disable=SC2086  # the command is words (a stand-in in tests)
  $ci_campaign_cmd --no-progress --out "$ci_out/$name" "$@" | tee "$ci_out/$name.stdout"
  rc=${PIPESTATUS[0]}
  ((errexit)) && set -e
  if [ "$rc" -ne 0 ]; then
    why=$(grep -m1 '^UNTESTED ' "$ci_out/$name.stdout" || true)
    ci_fail "$name" "exited $rc${why:+ ($why)}"
    return 0
  fi
  if ! why=$(ci_check_summary "$name" "$ci_out/$name.stdout" "$rc"); then
    ci_fail "$name" "$why"
  fi
}

ci_probe_cmd=${CI_PROBE_CMD:-durable-spaces probe}
# The grades in order, best first (durable_spaces/probe/grade.py).
ci_grades="exactly-once at-most-once-reported at-least-once unverified unsafe"

# ci_check_probe FILE RC GRADE: the probe's SUMMARY (its last line) says it ran, its
# kills landed, the lab broke nothing, and the grade is GRADE (or, for "X-or-better", X
# or better). Prints the reason and returns 1 when it does not hold.
ci_check_probe() {
  local file=$1 rc=$2 want=$3 line kv k
  line=$(grep -v '^[[:space:]]*$' "$file" | tail -n 1)
  if [[ $line != "SUMMARY probe "* ]]; then
    echo "no probe SUMMARY line last (last line: ${line:0:200})"
    return 1
  fi
  local -A f=()
  local -a words
  read -ra words <<<"${line#SUMMARY probe }"
  for kv in "${words[@]}"; do
    f[${kv%%=*}]=${kv#*=}
  done
  for k in runs steps kills lab_errors stuck; do
    if ! [[ ${f[$k]:-} =~ ^[0-9]+$ ]]; then
      echo "SUMMARY field $k is missing or not a count: ${line:0:300}"
      return 1
    fi
  done
  if ((f[runs] < 2 || f[kills] == 0)); then
    echo "runs=${f[runs]} kills=${f[kills]}: the probe tested no crash"
    return 1
  fi
  if ((f[lab_errors] > 0)); then
    echo "lab_errors=${f[lab_errors]}: the lab broke runs"
    return 1
  fi
  [ "$rc" -eq 0 ] || { echo "exited $rc"; return 1; }
  local got=${f[grade]:-} best=${want%-or-better}
  if [[ $got == partial:* ]]; then  # an exhaustive probe that missed pairs (pairs=x/y)
    echo "grade $got: the probe covered only ${f[pairs]:-some} kill point x step pairs"
    return 1
  fi
  if [[ " $ci_grades " != *" $got "* ]]; then
    echo "grade ${got:-missing} is not a grade"
    return 1
  fi
  if [ "$best" != "$want" ]; then  # X-or-better
    local g
    for g in $ci_grades; do
      [ "$g" = "$got" ] && return 0
      [ "$g" = "$best" ] && break
    done
    echo "grade $got is worse than $best"
    return 1
  fi
  if [ "$got" != "$want" ]; then
    echo "grade $got, expected $want (the lab must see what this harness does)"
    return 1
  fi
  return 0
}

# ci_probe NAME GRADE ARGS...: one exhaustive probe into $ci_out/NAME, graded GRADE
# exactly (a harness with a known defect must get the grade it implies), or X-or-better.
ci_probe() {
  local name=$1 want=$2 rc errexit=0 why
  shift 2
  echo "== probe $name"
  mkdir -p "$ci_out"
  [[ $- == *e* ]] && errexit=1
  set +e
  # shellcheck disable=SC2086  # the command is words (a stand-in in tests)
  $ci_probe_cmd --scenario exhaustive --out "$ci_out/$name" "$@" | tee "$ci_out/$name.stdout"
  rc=${PIPESTATUS[0]}
  ((errexit)) && set -e
  if ! why=$(ci_check_probe "$ci_out/$name.stdout" "$rc" "$want"); then
    ci_fail "$name" "$why"
  fi
}

# A CI log keeps its tail: the campaigns that failed are named again at the end, each
# with its failed runs (their failing checks, details and repro commands).
ci_recap() {
  [ ${#ci_failed[@]} -eq 0 ] && return 0
  echo "== FAILED campaigns:"
  local f
  for f in "${ci_failed[@]}"; do
    echo "   ${f%%:*}: ${f#*:}"
  done
  for f in "${ci_failed[@]}"; do
    [ -d "$ci_out/${f%%:*}/runs" ] || continue
    python - "$ci_out/${f%%:*}" <<'PY' || true
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
print(f"-- {d.name}")
for p in sorted((d / "runs").glob("*.json")):
    r = json.loads(p.read_text())
    if r.get("outcome") == "ok":
        continue
    print(f"   {r.get('run_id')} {r.get('outcome')}: {r.get('repro')}")
    for name, v in (r.get("checks") or {}).items():
        if v.get("valid") is not True:
            print(f"     {name} valid={v.get('valid')}: {str(v.get('detail'))[:300]}")
            for a in (v.get("anomalies") or [])[:3]:
                print(f"       {str(a)[:300]}")
    print(f"     faults: {json.dumps(r.get('faults'))[:300]}")
PY
  done
}
