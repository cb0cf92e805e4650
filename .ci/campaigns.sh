#!/usr/bin/env bash
# The CI fast subset: every adapter mode and every scenario on the embedded `local` backend
# and on the real cua-spacesd, with fixed seeds, real SQLite and real processes. Each
# campaign prints its SUMMARY line and fails the job if a single run was inconsistent, if
# it tested less than it planned (exit 4), or if its SUMMARY says it ran nothing or its
# kills did not land (.ci/lib.sh). A group whose capability is missing is skipped, saying
# why, outside CI, and fails the job on CI (CI=true; docs/lab-exit-codes.md).
# CI_CAMPAIGNS_ONLY="name ..." runs only those campaigns (a quick check of a few).
set -euo pipefail
cd "$(dirname "$0")/.."
export DO_NOT_TRACK=1 CUA_TELEMETRY=0
# Every campaign below names what it runs: the Makefile's (or a user's) CRASH_* knobs for
# `make campaign` must not leak in (CRASH_MODE=transactional once ran the server scenario
# without machine checkpoints, so its kills never landed).
unset CRASH_MODE CRASH_SCENARIO CRASH_BACKEND CRASH_RUNS CRASH_CALLS CRASH_JOBS \
  CRASH_SEED_BASE CRASH_DURABLE_MODE CRASH_PROFILE
# shellcheck source=.ci/lib.sh
. .ci/lib.sh
rm -rf "$ci_out"
only=" ${CI_CAMPAIGNS_ONLY:-} "
run() {
  [ -z "${CI_CAMPAIGNS_ONLY:-}" ] || [[ $only == *" $1 "* ]] || return 0
  ci_run "$@"
}
for backend in local spacesd; do
  if [ "$backend" = spacesd ] && ! ci_require spacesd spacesd; then
    continue
  fi
  run "transactional-$backend" --mode transactional --backend "$backend" --runs 12 --calls 6 --seed-base ci-tx
  run "auto-$backend" --mode auto --backend "$backend" --runs 8 --calls 6 --seed-base ci-auto
  run "checkpoint-$backend" --mode checkpoint --backend "$backend" --runs 12 --calls 6 --seed-base ci-cp --profile space
  run "stale-$backend" --scenario stale --backend "$backend" --runs 8 --calls 6 --seed-base ci-stale
  # Paused drivers taken over while they sleep, continued after; frozen Spaces.
  run "pause-$backend" --mode transactional --backend "$backend" --runs 8 --calls 6 --seed-base ci-pause --profile pause
  # One kill at every hit of every failpoint an uninterrupted run passes (the log's commits
  # and the harness's steps too): two calls, a command and a write (seed ci-ex31; its
  # commands sleep 0.2 s, so a command is always seen running), about 60 runs each.
  run "exhaustive-$backend" --scenario exhaustive --backend "$backend" --calls 2 --seed-base ci-ex31
  if [ "$backend" = local ]; then
    run "exhaustive-checkpoint-local" --scenario exhaustive --mode checkpoint --backend local \
      --calls 2 --seed-base ci-ex31
  fi
done
# The change journal in the Space (a microvm's, spacesd/guest_journal.pl) on the real
# daemon, the host scan off: daemon kills, restarts and removals of the Space, and its
# helper killed (journal_kill), under it.
if ci_require journal-in-space spacesd; then
  DS_HOST_SCAN=0 run "journal-in-space-spacesd" --mode transactional --backend spacesd --runs 12 --calls 6 --seed-base ci-gj --profile space-journal
fi
# Power losses of the host (powerfs: unsynced writes of the log, the ledger, the store and
# the workspace dropped or torn), the log at SQLite FULL: every run consistent.
if ci_require power fuse; then
  run "power-local" --mode transactional --backend local --runs 8 --calls 6 --seed-base ci-power --profile power
  run "power-checkpoint-local" --mode checkpoint --backend local --runs 6 --calls 5 --seed-base ci-pcp --profile power
  # the cua-spacesd daemon's data dir (ledger, epoch floor) on the mount too (~30 s)
  if ci_require power-spacesd spacesd; then
    run "power-spacesd" --mode transactional --backend spacesd --runs 4 --calls 6 --seed-base ci-psd --profile power
  fi
  # A slow disk: drivers stuck inside a stalled fsync, taken over, racing their successor
  # when the disk comes back; an fsync latency per run; a few power losses.
  run "slow-disk-local" --mode transactional --backend local --runs 6 --calls 5 --seed-base ci-sd --profile slow-disk
fi
# Logical-point schedules go the same way twice (the DETERMINISM line; exit 1 if not).
# Seeds whose first attempt kills at a point every call passes (3 of 4: a seed whose
# first attempt ends clean leaves its later attempts' kills planned and never reached).
run "determinism-local" --mode transactional --backend local --calls 6 --seed-base ci-logical \
  --profile logical --determinism 4
# The cluster: sessions through PostgreSQL, two hosts in network namespaces and two
# coordinators, one run of each of the seven redrive fault kinds (rd237 draws all seven).
if ci_require redrive postgres netns; then
  run "redrive-local" --scenario redrive --backend local --runs 7 --calls 6 --seed-base rd237 --jobs 2
fi
# Real containers: restarts (kill + start), removals and daemon kills, both adapter modes.
if ci_require docker docker; then
  run "transactional-docker" --mode transactional --backend docker --runs 6 --calls 6 --seed-base ci-dtx --profile space
  run "checkpoint-docker" --mode checkpoint --backend docker --runs 6 --calls 6 --seed-base ci-dcp --profile space
fi
# QEMU guests with whole-machine checkpoints: restarts and removals, and a server process
# that must survive a driver killed after a machine checkpoint and the restore.
if ci_require microvm microvm; then
  run "checkpoint-microvm" --mode checkpoint --backend microvm --runs 4 --calls 5 --seed-base ci-mcp --profile space
  run "server-microvm" --scenario server --mode checkpoint --backend microvm --runs 2 --calls 5 --seed-base ci-msv
fi
# The probe: harnesses crash-tested from outside through the scripted model server, one
# exhaustive probe each (every kill point of every step once). The fake harnesses have one
# known defect each and must get exactly the grade it implies (phantom's made-up "ok" is
# no evidence: unverified; inplace rewrites its transcript in place, which only the kill
# points inside its state writes show); LangGraph re-runs an
# interrupted tool (at-least-once); the control (this project's harness and adapter) must
# grade at-most-once-reported or better under both faults, and so must LangGraph with the
# integration's tools (docs/integrations.md), under a process kill and a power cut; Pi's
# bash outlives a kill.
probe() {
  [ -z "${CI_CAMPAIGNS_ONLY:-}" ] || [[ $only == *" $1 "* ]] || return 0
  ci_probe "$@"
}
fakes=tests/probe/fakes
probe probe-fake-correct at-most-once-reported-or-better --harness "$fakes/correct" --steps 3
probe probe-fake-rerun at-least-once --harness "$fakes/rerun" --steps 3
probe probe-fake-phantom unverified --harness "$fakes/phantom" --steps 3
probe probe-fake-fresh at-most-once-reported --harness "$fakes/fresh" --steps 3
probe probe-fake-inplace-state at-least-once --harness "$fakes/inplace" --steps 2 --at all
probe probe-fake-detached unsafe --harness "$fakes/detached" --steps 3
probe probe-control at-most-once-reported-or-better --harness durable-spaces --steps 3
probe probe-control-machine at-most-once-reported-or-better --harness durable-spaces --steps 3 --fault machine
probe probe-langgraph at-least-once --harness langgraph --steps 3
probe probe-langgraph-durable at-most-once-reported-or-better --harness langgraph-durable --steps 3
probe probe-langgraph-async-durable-power at-most-once-reported-or-better --harness langgraph-async-durable --steps 3 --fault power
if ci_require probe-pi pi; then
  probe probe-pi unsafe --harness pi --steps 3
fi
ci_recap
exit $ci_status
