#!/usr/bin/env bash
# The CI fast subset: every adapter mode and every scenario on the embedded `local` backend
# and on the real cua-spacesd, with fixed seeds, real SQLite and real processes. Each
# campaign prints its SUMMARY line and fails the job if a single run was inconsistent.
set -euo pipefail
cd "$(dirname "$0")/.."
export DO_NOT_TRACK=1 CUA_TELEMETRY=0
# Every campaign below names what it runs: the Makefile's (or a user's) CRASH_* knobs for
# `make campaign` must not leak in (CRASH_MODE=transactional once ran the server scenario
# without machine checkpoints, so its kills never landed).
unset CRASH_MODE CRASH_SCENARIO CRASH_BACKEND CRASH_RUNS CRASH_CALLS CRASH_JOBS \
  CRASH_SEED_BASE CRASH_DURABLE_MODE CRASH_PROFILE
out=${CI_CAMPAIGNS_OUT:-campaigns-out/ci}
rm -rf "$out"
status=0
failed=()
run() {
  local name=$1; shift
  echo "== campaign $name"
  local rc=0
  durable-spaces campaign --no-progress --out "$out/$name" "$@" || rc=$?
  if [ "$rc" -ne 0 ]; then
    status=1
    failed+=("$name:$rc")
  fi
}
# A CI log keeps its tail: the campaigns that failed are named again at the end, each
# with its failed runs (their failing checks, details and repro commands).
recap() {
  [ ${#failed[@]} -eq 0 ] && return 0
  echo "== FAILED campaigns: ${failed[*]}"
  for f in "${failed[@]}"; do
    python - "$out/${f%%:*}" "${f##*:}" <<'PY' || true
import json, sys
from pathlib import Path
d, rc = Path(sys.argv[1]), sys.argv[2]
print(f"-- {d.name} exited {rc}")
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
for backend in local spacesd; do
  run "transactional-$backend" --mode transactional --backend "$backend" --runs 12 --calls 6 --seed-base ci-tx
  run "auto-$backend" --mode auto --backend "$backend" --runs 8 --calls 6 --seed-base ci-auto
  run "checkpoint-$backend" --mode checkpoint --backend "$backend" --runs 12 --calls 6 --seed-base ci-cp --profile space
  run "stale-$backend" --scenario stale --backend "$backend" --runs 8 --calls 6 --seed-base ci-stale
  # Paused drivers taken over while they sleep, continued after; frozen Spaces.
  run "pause-$backend" --mode transactional --backend "$backend" --runs 8 --calls 6 --seed-base ci-pause --profile pause
  run "exhaustive-$backend" --scenario exhaustive --backend "$backend" --calls 4 --seed-base ci-ex
done
# The change journal in the Space (a microvm's, spacesd/guest_journal.pl) on the real
# daemon, the host scan off: daemon kills, restarts and removals of the Space, and its
# helper killed (journal_kill), under it.
export DS_HOST_SCAN=0
run "journal-in-space-spacesd" --mode transactional --backend spacesd --runs 12 --calls 6 --seed-base ci-gj --profile space-journal
unset DS_HOST_SCAN
# Power losses of the host (powerfs: unsynced writes of the log, the ledger, the store and
# the workspace dropped or torn), the log at SQLite FULL: every run consistent.
if why=$(python -c 'from durable_spaces.chaos.powerfs import unavailable as u; import sys; r=u(); print(r or ""); sys.exit(1 if r else 0)'); then
  run "power-local" --mode transactional --backend local --runs 8 --calls 6 --seed-base ci-power --profile power
  run "power-checkpoint-local" --mode checkpoint --backend local --runs 6 --calls 5 --seed-base ci-pcp --profile power
  # the cua-spacesd daemon's data dir (ledger, epoch floor) on the mount too (~30 s)
  run "power-spacesd" --mode transactional --backend spacesd --runs 4 --calls 6 --seed-base ci-psd --profile power
  # A slow disk: drivers stuck inside a stalled fsync, taken over, racing their successor
  # when the disk comes back; an fsync latency per run; a few power losses.
  run "slow-disk-local" --mode transactional --backend local --runs 6 --calls 5 --seed-base ci-sd --profile slow-disk
else
  echo "== power campaigns skipped: $why"
fi
# Logical-point schedules go the same way twice (the DETERMINISM line; exit 1 if not).
run "determinism-local" --mode transactional --backend local --calls 6 --seed-base ci-det \
  --profile logical --determinism 4
# The cluster: sessions through PostgreSQL, two hosts in network namespaces and two
# coordinators, one run of each of the seven redrive fault kinds (rd237 draws all seven).
if why=$(python -c 'from durable_spaces.campaigns.scenarios.redrive import unavailable_reason as u; import sys; r=u("local"); print(r or ""); sys.exit(1 if r else 0)'); then
  run "redrive-local" --scenario redrive --backend local --runs 7 --calls 6 --seed-base rd237 --jobs 2
else
  echo "== redrive campaign skipped: $why"
fi
# Real containers: restarts (kill + start), removals and daemon kills, both adapter modes.
if why=$(python -c 'from durable_spaces.backends import unavailable_reason as u; import sys; r=u("docker"); print(r or ""); sys.exit(1 if r else 0)'); then
  run "transactional-docker" --mode transactional --backend docker --runs 6 --calls 6 --seed-base ci-dtx --profile space
  run "checkpoint-docker" --mode checkpoint --backend docker --runs 6 --calls 6 --seed-base ci-dcp --profile space
else
  echo "== docker campaigns skipped: $why"
fi
# QEMU guests with whole-machine checkpoints: restarts and removals, and a server process
# that must survive a driver killed after a machine checkpoint and the restore.
if why=$(python -c 'from durable_spaces.backends import unavailable_reason as u; import sys; r=u("microvm"); print(r or ""); sys.exit(1 if r else 0)'); then
  run "checkpoint-microvm" --mode checkpoint --backend microvm --runs 4 --calls 5 --seed-base ci-mcp --profile space
  run "server-microvm" --scenario server --mode checkpoint --backend microvm --runs 2 --calls 5 --seed-base ci-msv
else
  echo "== microvm campaigns skipped: $why"
fi
recap
exit $status
