"""A Space knows its own log: its owner record, kept in its exec ledger.

A log knows its Space (the ``cua.space`` document names it and its instance); this is
the other half. Two logs must never share a Space, its keys or its ledger records by
accident: a driver started with a reused session name and a fresh log, or a second live
log of one session name, found the first log's Space, took it for its own and reverted
it to its empty log (``log_witness.py`` took it for a log that lost its tail), or was
told the other's command output (one position key, two logs). Keys now carry the log's
identity (``Storage.identity``), so two logs never share one; what is left is to see,
before anything changes, that a Space is another log's, and to say so.

The record. Claim ``n`` of a Space is the ledger key ``ds-owner#<n>``, a ``printf`` of
``{"log": <identity>, "conversation": <id>}`` run under it at the claimant's epoch, so
the daemon keeps the text with the key (its output tail). The owner is the last claim
whose output is a whole record: the keys are read in order until one is unknown. A
claim a crash cut off before its text (no output, or a lost record without it) is void;
one whose text is not ours is a damaged record (below).

When a driver binds to a Space it found, before it raises the Space's epoch (which kills
whatever the owner runs), it reads the claims once:

- none: the Space is new (created now, or placed again), from an adapter before owner
  records, or prepared by hand: it is claimed, its workspace kept as it is (transactional
  mode takes it into the image as changes made outside the calls);
- this log and this conversation: nothing to do;
- anything else (another log, another conversation of this log, a damaged record):
  ``SpaceOwnedError``, one line that says what was found and how to go on, and nothing
  changed. ``DS_SPACE_ADOPT`` (``settings.py``) says otherwise: ``as-is`` claims the
  Space and takes its workspace as it is; ``log`` claims it and takes it back to this
  log (what only the Space held kept in a quarantine checkpoint, ``quarantine.py``). A
  claim is a mutation under the claimant's newer epoch: the old owner's drivers are
  fenced, and the next of them reads the new claim and is refused in turn.

Where the adapter cannot tell "this log lost everything" from "this is a new log": it
always can now. The identity is durable from the log's creation, so a log that lost
every commit still has it (its Space's claims name it; the witness then brings the Space
back and skips the positions it knew), and a new log (even at a deleted log's path) has
another. What looks the same to it is a *copy* of a log: the same identity, so the same
log, which lost its tail if it is older. Two copies driven at once share positions; the
epoch fences one of them, and at one epoch nothing tells them apart (docs/log-loss.md).

Why the ledger: it is the one record every backend keeps durably before a command runs,
fenced by the epoch, and out of reach of the Space's commands where the backend separates
the daemon's user from the Space's (docker, microvm). A command on ``local`` or
``spacesd`` runs as the ledger's own user and could forge a claim: at worst a refusal
(nothing is ever deleted on a claim's word alone), as docs/journal-trust.md says of the
journal. A file beside the workspace would be writable by the Space's user everywhere.
Cost: two ``exec_record``s per Space and driver, off the call path, and one ``spawn``
when a Space is claimed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

from durable_spaces.errors import BadFileError, SpaceOwnedError
from durable_spaces.harness.log_core import IDENTITY
from durable_spaces.host.bounded import parse_json
from durable_spaces.space import ExecState, Space

#: Claim ``n``'s ledger key.
KEY = "ds-owner#{n}"
#: Claims read at most: a Space changes hands a few times, never this often.
MAX_CLAIMS = 256
#: What the adapter names conversations with (``harness/state.py``'s ids, a fork's too).
_CONVERSATION = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
#: What ``DS_SPACE_ADOPT`` may ask: refuse another log's Space, take it as it is, or take
#: it back to this log.
Adopt = Literal["refuse", "as-is", "log"]
ADOPT: tuple[Adopt, ...] = ("refuse", "as-is", "log")


@dataclass(frozen=True)
class Owner:
    """Who a Space is for: a log (its identity) and one of its conversations."""

    log: str
    conversation: str

    def text(self) -> str:
        return json.dumps({"log": self.log, "conversation": self.conversation}, sort_keys=True)

    @staticmethod
    def parse(data: bytes) -> Owner | None:
        """The owner a claim's output names, None if it is not a whole record of ours."""
        try:
            obj = parse_json(data, where="a claim")
        except BadFileError:
            return None
        if not isinstance(obj, dict) or set(obj) != {"log", "conversation"}:
            return None
        log, conv = obj["log"], obj["conversation"]
        if not isinstance(log, str) or not IDENTITY.fullmatch(log):
            return None
        if not isinstance(conv, str) or not _CONVERSATION.fullmatch(conv):
            return None
        return Owner(log, conv)

    def short(self) -> str:
        return f"log {self.log[:12]}, conversation {self.conversation}"


@dataclass(frozen=True)
class Claims:
    """A Space's claims as read: the owner (None: never claimed), the number the next
    claim takes, and what is wrong with the last one when it is not ours."""

    owner: Owner | None
    next: int
    damaged: str | None = None


async def read(space: Space) -> Claims:
    """The Space's claims, read in order until an unknown key (module doc)."""
    owner: Owner | None = None
    damaged: str | None = None
    for n in range(1, MAX_CLAIMS + 1):
        rec = await space.exec_record(KEY.format(n=n))
        if rec.state is ExecState.UNKNOWN:
            return Claims(owner, n, damaged)
        text = (rec.output_tail or b"").strip()
        if not text or rec.state is ExecState.RUNNING:
            continue  # cut off before its text (or still printing it): void
        found = Owner.parse(text)
        if found is None or (rec.exit_code not in (0, None)):
            owner, damaged = None, f"claim #{n} is not a record of ours ({text[:60]!r})"
        else:
            owner, damaged = found, None
    return Claims(None, MAX_CLAIMS + 1, f"it has more than {MAX_CLAIMS} claims")


async def claim(space: Space, owner: Owner, n: int, epoch: int) -> None:
    """Record ``owner`` as claim ``n`` (fenced by ``epoch``); a claim someone else took
    first under that number is refused (``SpaceOwnedError``): read again."""
    key = KEY.format(n=n)
    run = await space.spawn(
        ["printf", "%s", owner.text()], key=key, epoch=epoch, cwd="/", keep_output=4096
    )
    res = await run.wait()
    if Owner.parse(res.output.strip()) != owner:
        raise SpaceOwnedError(
            f"Space {space.name}: its claim #{n} was taken by another driver at the same "
            "moment; nothing was changed: run again"
        )


#: ``inherit``: the Space is another conversation's of this log that the asking one was
#: bound to take over (``SpaceKeeper.bind``'s ``heir_of``): claimed anew, nothing changed.
Verdict = Literal["mine", "unclaimed", "take", "inherit"]


def judge(claims: Claims, me: Owner, adopt: str, name: str, any_conversation: bool) -> Verdict:
    """What a driver of ``me`` does with a Space whose claims are ``claims`` (module doc);
    ``any_conversation``: the conversation is not known yet (a driver's first fence of a
    Space placed for it), so a claim of this log for any of its conversations is its own.
    Raises ``SpaceOwnedError`` when ``adopt`` is ``refuse`` and the Space is not ours."""
    owner = claims.owner
    if claims.damaged is None and owner is None:
        return "unclaimed"
    if (
        owner is not None
        and owner.log == me.log
        and (any_conversation or owner.conversation == me.conversation)
    ):
        return "mine"
    if adopt != "refuse":
        return "take"
    if claims.damaged is not None:
        found = f"its owner record cannot be trusted: {claims.damaged}"
    elif owner is not None and owner.log == me.log:
        found = f"it belongs to another conversation of this log ({owner.conversation})"
    else:
        assert owner is not None
        found = f"it belongs to another log ({owner.short()}; this log is {me.log[:12]})"
    raise SpaceOwnedError(
        f"Space {name}: {found}. Nothing was changed. To take the Space as it is into "
        "this log, set DS_SPACE_ADOPT=as-is; to take it back to this log (what only the "
        "Space holds is kept in a quarantine checkpoint), DS_SPACE_ADOPT=log; or give "
        "this session another name"
    )
