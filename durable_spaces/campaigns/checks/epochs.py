"""No stale writer: not in the log, not among the launches, not in the Space.

- ``stale_commit``: a commit by an epoch below one already committed (the fence let an
  old driver through), or one without an epoch after fenced ones;
- ``fence_below_commit``: the log's fence floor is below a committed epoch (the next
  driver's fence would not cut off that epoch);
- ``two_drivers_one_epoch``: the launch history (the coordinator's ``launch`` events)
  issued one epoch to two launches, or a commit carries an epoch no launch was issued;
- ``stale_write``: a workspace node changed after the session's last commit. The log
  stores no time, so the last commit is bounded from above by the log files' mtime and
  by the ``done`` event of a driver at least as new as every commit (the earlier of the
  two counts). Checked only where the Space's file times come from this host's clock
  (local, spacesd, docker; not a microVM's guest clock), with ``SLACK_NS`` for timestamp
  granularity: a stale write within that slack of the last commit is not seen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from durable_spaces.campaigns.checks.verdict import Anomaly, Verdict, anomaly, judge

if TYPE_CHECKING:
    from durable_spaces.campaigns.checks.inputs import Inputs

SLACK_NS = 20_000_000


def stale_commits(inputs: Inputs) -> tuple[list[Anomaly], int | None]:
    """Commits whose epoch went down; and the highest committed epoch."""
    out: list[Anomaly] = []
    high: int | None = None
    high_seq = 0
    for c in inputs.log.commits:
        if c.epoch is None:
            if high is not None:
                detail = f"commit {c.seq} carries no epoch after epoch {high} (commit {high_seq})"
                out.append(anomaly("stale_commit", detail, witness=[high_seq, c.seq]))
            continue
        if high is not None and c.epoch < high:
            detail = f"commit {c.seq} by epoch {c.epoch} after epoch {high} (commit {high_seq})"
            out.append(anomaly("stale_commit", detail, witness=[high_seq, c.seq]))
        elif high is None or c.epoch > high:
            high, high_seq = c.epoch, c.seq
    floor = inputs.log.floor
    if floor is not None and high is not None and floor < high:
        detail = f"the fence floor is {floor}, below epoch {high} of commit {high_seq}"
        out.append(anomaly("fence_below_commit", detail, witness=[high_seq]))
    return out, high


def launch_anomalies(inputs: Inputs) -> list[Anomaly]:
    launches = inputs.launches or []
    out: list[Anomaly] = []
    by_epoch: dict[int, list[int | None]] = {}
    for la in launches:
        by_epoch.setdefault(la.epoch, []).append(la.pid)
    seqs: dict[int, list[int]] = {}
    for c in inputs.log.commits:
        if c.epoch is not None:
            seqs.setdefault(c.epoch, []).append(c.seq)
    for epoch, pids in sorted(by_epoch.items()):
        if len(pids) > 1:
            detail = f"epoch {epoch} was issued to {len(pids)} launches (pids {pids})"
            out.append(anomaly("two_drivers_one_epoch", detail, witness=seqs.get(epoch, [])))
    for epoch, written in sorted(seqs.items()):
        if epoch not in by_epoch:
            detail = f"epoch {epoch} wrote {len(written)} commits but no launch was issued it"
            out.append(anomaly("two_drivers_one_epoch", detail, witness=written))
    return out


def last_commit_bound(inputs: Inputs, high: int | None) -> tuple[int, str] | None:
    """(ns, what bounds it): a time no earlier than the last commit, or None."""
    bounds: list[tuple[int, str]] = []
    if inputs.log.written_ns is not None:
        bounds.append((inputs.log.written_ns, "the log files' mtime"))
    done = [la for la in inputs.launches or [] if la.done_ms is not None]
    if done:
        top = max(done, key=lambda la: la.epoch)
        if high is None or top.epoch >= high:
            assert top.done_ms is not None
            bounds.append((int(top.done_ms * 1_000_000), f"epoch {top.epoch}'s done event"))
    return min(bounds) if bounds else None


def stale_writes(inputs: Inputs, high: int | None) -> tuple[list[Anomaly], str]:
    ws = inputs.workspace
    if not inputs.host_clock:
        return [], "stale writes not checked (the Space's clock is not this host's)"
    if not ws.fine_times:
        return [], "stale writes not checked (the workspace's times are whole seconds)"
    bound = last_commit_bound(inputs, high)
    if bound is None:
        return [], "stale writes not checked (no time bounds the last commit)"
    at, what = bound
    last_seq = inputs.log.commits[-1].seq if inputs.log.commits else 0
    out = []
    for path, node in sorted(ws.nodes.items()):
        changed = node.changed_ns
        if changed is not None and changed > at + SLACK_NS:
            late = (changed - at) / 1e6
            detail = f"changed {late:.0f} ms after the last commit (bounded by {what})"
            out.append(anomaly("stale_write", detail, path=path, witness=[last_seq]))
    return out, f"no change after the last commit ({what})"


def no_stale_writes(inputs: Inputs) -> Verdict:
    """Commit epochs never go down, each epoch had one driver, and nothing changed the
    workspace after the last commit."""
    found, high = stale_commits(inputs)
    notes = [f"highest epoch {high}"]
    if inputs.launches is None:
        notes.append("launches not checked (no launch history)")
    else:
        found += launch_anomalies(inputs)
        notes.append(f"{len(inputs.launches)} launches, one per epoch")
    writes, note = stale_writes(inputs, high)
    found += writes
    notes.append(note)
    return judge(found, "; ".join(notes))
