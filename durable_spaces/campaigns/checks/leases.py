"""The cluster's own guarantees, judged from the store's event log (``cluster/store.py``).

A redrive run (``campaigns/scenarios/redrive.py``) is checked twice: the checker's
verdicts on each session's log and workspace, and these, read from the append-only
``ds.events`` table every transition writes in its own transaction:

- ``lease_violations``: a lease token granted that is not the previous one + 1
  (``token_not_next``); a lease granted to a second session while the first still held
  it, unreleased, its session still open (``two_holders``); a driver doing its first
  step after its lease token was superseded (``stale_token_used``: a stale holder was
  let work); and, from the scenario's probe (``redrive.probe_superseded``), a superseded
  token accepted by renew, connection or release (``stale_token_accepted``);
- ``epoch_violations``: an epoch not above every earlier one of its session
  (``epoch_not_increasing``); an epoch other than ``max(previous + 1, lease token)``
  (``epoch_not_max``); an epoch launched twice, or launched without being issued
  (``two_drivers_one_epoch``); a driver launched after a newer epoch was issued
  (``stale_launch``).

Times: an event's ``at`` is the database's ``now()``; ``unix_ms`` in a detail is the
coordinator's clock. Both are this machine's clock in the lab; on real machines a
clock skew above ``SKEW_MS`` could make ``stale_token_used`` or ``stale_launch`` fire.
The counters a SUMMARY line shows (``drives``, ``spaces_replaced``, ``tokens_refused``,
``races``) come from the same events.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from durable_spaces.campaigns.checks.verdict import Anomaly, Verdict, anomaly, judge
from durable_spaces.cluster.records import Event

#: Clock slack between the database's ``now()`` and a coordinator's ``unix_ms``.
SKEW_MS = 5.0


def _ms(e: Event) -> float:
    return e.at.timestamp() * 1000


@dataclass
class LeaseTally:
    """What a run's events show: the counters and each violation found."""

    drives: int = 0
    spaces_replaced: int = 0
    tokens_refused: int = 0
    races: int = 0
    lease: list[Anomaly] = field(default_factory=list)
    epoch: list[Anomaly] = field(default_factory=list)

    def counters(self) -> dict[str, int]:
        """The SUMMARY fields of one run (``redrive.SUMMARY_FIELDS``)."""
        return {
            "drives": self.drives,
            "spaces_replaced": self.spaces_replaced,
            "tokens_refused": self.tokens_refused,
            "races": self.races,
            "lease_violations": len(self.lease),
            "epoch_violations": len(self.epoch),
        }

    def verdicts(self) -> dict[str, Verdict]:
        return {
            "no_lease_violations": judge(self.lease, "each token the next, one holder at a time"),
            "no_epoch_violations": judge(self.epoch, "epochs max(prev+1, token), one driver each"),
        }


def tally(events: Iterable[Event]) -> LeaseTally:
    evs = sorted(events, key=lambda e: e.id)
    t = LeaseTally()
    t.drives = sum(1 for e in evs if e.kind == "driver_launched")
    t.spaces_replaced = sum(
        1 for e in evs if e.kind == "space_placed" and int(e.detail.get("generation", 1)) > 1
    )
    t.tokens_refused = sum(1 for e in evs if e.kind == "lease_refused")
    t.races = _races(evs)
    t.lease = _lease_anomalies(evs)
    t.epoch = _epoch_anomalies(evs)
    return t


def _races(evs: Sequence[Event]) -> int:
    """Sessions that waited for another's lease and then got it."""
    waited = {(e.session, e.space) for e in evs if e.kind == "lease_pending"}
    got = {(e.session, e.space) for e in evs if e.kind == "lease_acquired"}
    return len(waited & got)


def _lease_anomalies(evs: Sequence[Event]) -> list[Anomaly]:
    out: list[Anomaly] = []
    token: dict[str, int] = defaultdict(int)  # space -> newest token granted
    holder: dict[str, str | None] = {}  # space -> session holding it
    granted: dict[str, list[tuple[float, int]]] = defaultdict(list)  # space -> (at, token)
    finished: set[str] = set()
    released: set[tuple[str, str, int]] = set()
    for e in evs:
        if e.kind == "session_finished" and e.session:
            finished.add(e.session)
        elif e.kind == "lease_released" and e.space and e.session:
            released.add((e.space, e.session, int(e.detail.get("token", 0))))
        elif e.kind == "lease_acquired" and e.space:
            new, prev = int(e.detail.get("token", 0)), token[e.space]
            if new != prev + 1:
                detail = f"space {e.space}: token {new} granted after token {prev}"
                out.append(anomaly("token_not_next", detail, witness=[e.id]))
            before = holder.get(e.space)
            if (
                before is not None
                and before != e.session
                and before not in finished
                and (e.space, before, prev) not in released
            ):
                detail = f"space {e.space}: token {new} to {e.session} while {before} held {prev}"
                out.append(anomaly("two_holders", detail, witness=[e.id]))
            token[e.space], holder[e.space] = max(new, prev), e.session
            granted[e.space].append((_ms(e), new))
    issued = _issued(evs)
    for e in evs:
        if e.kind != "driver_first_step" or not e.session:
            continue
        got = issued.get((e.session, int(e.detail.get("epoch", 0))))
        if got is None or got.space is None or got.detail.get("lease_token") is None:
            continue
        mine, at = int(got.detail["lease_token"]), float(e.detail.get("unix_ms", 0))
        newer = [tok for ms, tok in granted[got.space] if tok > mine and ms + SKEW_MS < at]
        if newer:
            detail = (
                f"{e.session} epoch {e.detail.get('epoch')} stepped with token {mine}"
                f" after token {min(newer)} was granted"
            )
            out.append(anomaly("stale_token_used", detail, witness=[e.id]))
    return out


def _issued(evs: Sequence[Event]) -> dict[tuple[str, int], Event]:
    return {
        (e.session, int(e.detail["epoch"])): e
        for e in evs
        if e.kind == "epoch_issued" and e.session and "epoch" in e.detail
    }


def _epoch_anomalies(evs: Sequence[Event]) -> list[Anomaly]:
    out: list[Anomaly] = []
    high: dict[str, int] = {}
    issued_at: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for e in evs:
        if e.kind != "epoch_issued" or not e.session:
            continue
        epoch, prev = int(e.detail.get("epoch", 0)), int(e.detail.get("previous") or 0)
        token = int(e.detail.get("lease_token") or 0)
        if e.session in high and epoch <= high[e.session]:
            detail = f"{e.session}: epoch {epoch} issued after epoch {high[e.session]}"
            out.append(anomaly("epoch_not_increasing", detail, witness=[e.id]))
        if epoch != max(prev + 1, token):
            detail = f"{e.session}: epoch {epoch} != max({prev} + 1, token {token})"
            out.append(anomaly("epoch_not_max", detail, witness=[e.id]))
        high[e.session] = max(epoch, high.get(e.session, epoch))
        issued_at[e.session].append((_ms(e), epoch))
    issued = _issued(evs)
    launches: Counter[tuple[str, int]] = Counter()
    for e in evs:
        if e.kind != "driver_launched" or not e.session:
            continue
        key = (e.session, int(e.detail.get("epoch", 0)))
        launches[key] += 1
        if key not in issued or launches[key] > 1:
            seen = launches[key]
            detail = f"{e.session}: epoch {key[1]} launched {seen}x, issued: {key in issued}"
            out.append(anomaly("two_drivers_one_epoch", detail, witness=[e.id]))
        at = float(e.detail.get("unix_ms", 0))
        newer = [ep for ms, ep in issued_at[e.session] if ep > key[1] and ms + SKEW_MS < at]
        if newer:
            detail = f"{e.session}: epoch {key[1]} launched after epoch {min(newer)} was issued"
            out.append(anomaly("stale_launch", detail, witness=[e.id]))
    return out
