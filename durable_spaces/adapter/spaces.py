"""The conversations' Spaces as this driver holds them: names, owners, epochs,
capabilities.

A Space is named from ``<namespace>/<conversation id>``, or without a namespace from
``<log identity>/<conversation id>`` (so a second log in the same spaces directory, or a
new log where a deleted one was, gets a Space of its own), or bound to a name a
coordinator placed. The first use of a Space in a driver reads its owner record
(``space_owner.py``) and refuses another log's Space before anything changes; then it
raises the Space's epoch floor to the session's epoch, which kills every older driver's
commands; a new log on a Space already at exactly that epoch uses one above it (two
sessions must never share an epoch on one Space). Whether the Space is still the one the
log knows is for ``durable.py`` to decide; this module only finds, creates, judges and
fences.
"""

from __future__ import annotations

import asyncio

from durable_spaces.adapter import space_owner
from durable_spaces.adapter.config import AdapterConfig
from durable_spaces.adapter.space_owner import Claims, Owner, Verdict
from durable_spaces.errors import ConfigError, HaltError, SpaceUnavailableError, StaleEpochError
from durable_spaces.space import Capabilities, Space, space_name

#: What transactional mode (``modes.py``) runs in a Space.
TOOLING = ("find", "stat", "xargs", "sha256sum", "tar")


async def missing_tooling(space: Space, epoch: int) -> str | None:
    """Why the Space lacks ``TOOLING``, or None."""
    script = " && ".join(f"command -v {t} >/dev/null" for t in TOOLING)
    res = await space.exec(["bash", "-c", script], key=None, epoch=epoch, cwd="/")
    if res.exit_code == 0:
        return None
    return f"tooling missing in the Space (needs {', '.join(TOOLING)})"


class SpaceKeeper:
    """The open Spaces of one adapter (one driver)."""

    def __init__(self, config: AdapterConfig) -> None:
        self.config = config
        self.open: dict[str, Space] = {}
        self._bound: dict[str, str] = {}
        #: Per conversation, the conversations of this log whose Space it takes over.
        self.heirs: dict[str, frozenset[str]] = {}
        self._epochs: dict[str, int] = {}
        self._caps: dict[str, Capabilities] = {}
        self._tooling: dict[str, str | None] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        #: The log's identity (``DurableSpaces.bind_log``): names Spaces, keys, claims.
        self.log_id: str | None = None
        #: Per Space, its claims as this driver read them, and what it made of them.
        self._claims: dict[str, Claims] = {}
        self._previous: dict[str, Owner | None] = {}
        self.verdicts: dict[str, Verdict] = {}

    # --- names ------------------------------------------------------------------------------

    def bind(self, conversation_id: str, name: str, heir_of: frozenset[str] = frozenset()) -> None:
        self._bound[conversation_id] = name
        if heir_of:
            self.heirs[conversation_id] = heir_of

    def name_for(self, conversation_id: str) -> str:
        if conversation_id in self._bound:
            return self._bound[conversation_id]
        if self.config.name_for is not None:
            return self.config.name_for(conversation_id)
        if ns := self.config.namespace:
            return space_name(f"{ns}/{conversation_id}")
        if not self.log_id:
            raise ConfigError(
                "the adapter does not know its log yet: install its extension in the "
                "harness's registry (its Spaces are named by the log's identity)"
            )
        return space_name(f"{self.log_id}/{conversation_id}")

    def lock(self, name: str) -> asyncio.Lock:
        """Wrapped calls run one at a time per Space."""
        return self._locks.setdefault(name, asyncio.Lock())

    # --- what a Space can do -------------------------------------------------------------

    async def capabilities(self, space: Space) -> Capabilities:
        if space.name not in self._caps:
            self._caps[space.name] = await space.capabilities()
        return self._caps[space.name]

    async def tooling(self, space: Space) -> str | None:
        """Why the Space lacks what transactional mode needs (asked once), or None."""
        if space.name not in self._tooling:
            missing = await missing_tooling(space, self.epoch_for(space.name))
            self._tooling[space.name] = missing
        return self._tooling[space.name]

    # --- epochs -------------------------------------------------------------------------

    def epoch_for(self, name: str) -> int:
        return self._epochs.get(name, self.config.epoch)

    def fenced(self, name: str) -> bool:
        """Whether this driver already raised the Space's floor."""
        return name in self._epochs

    def _stale(self, err: StaleEpochError) -> StaleEpochError:
        if self.config.on_stale is not None:
            self.config.on_stale(err)
        return err

    # --- owners -------------------------------------------------------------------------

    def _me(self, conv: str | None) -> Owner:
        if not self.log_id:
            raise ConfigError("a Space is judged before the adapter knows its log")
        return Owner(self.log_id, conv or "")

    async def judge(self, space: Space, conv: str | None) -> Verdict:
        """Whether the Space is this log's, unclaimed, or to be taken (``space_owner``):
        its claims read once per driver; ``SpaceOwnedError`` when it is another's and
        ``DS_SPACE_ADOPT`` does not say to take it. ``conv`` None: the conversation is
        not known yet (a Space placed for the driver), any of this log's will do."""
        claims = self._claims.get(space.name)
        if space.name in self.verdicts and conv is not None:
            owner = claims.owner if claims is not None else None
            if owner is None or owner.conversation == conv:  # not a verdict for another's
                return self.verdicts[space.name]
        if claims is None:
            claims = self._claims[space.name] = await space_owner.read(space)
        owner = claims.owner
        if (
            conv is not None
            and claims.damaged is None
            and owner is not None
            and owner.log == self._me(conv).log
            and owner.conversation in self.heirs.get(conv, ())
        ):
            self.verdicts[space.name] = "inherit"
            return "inherit"
        adopt = self.config.settings.space_adopt
        verdict = space_owner.judge(
            claims, self._me(conv), adopt, space.name, any_conversation=conv is None
        )
        if conv is not None:
            self.verdicts[space.name] = verdict
        return verdict

    def previous_owner(self, name: str) -> Owner | None:
        """Whose the Space was before this driver claimed it (None: nobody's, or a
        record that could not be read)."""
        return self._previous.get(name)

    async def claim(self, space: Space, conv: str) -> Verdict:
        """Make the Space this log's (a claim under this driver's epoch, once fenced)
        unless it is already; returns what it was (``mine``: nothing done)."""
        verdict = await self.judge(space, conv)
        if verdict == "mine":
            return verdict
        claims = self._claims[space.name]
        await space_owner.claim(space, self._me(conv), claims.next, self.epoch_for(space.name))
        self._previous[space.name] = claims.owner
        self._claims[space.name] = Claims(self._me(conv), claims.next + 1)
        self.verdicts[space.name] = "mine"
        return verdict

    # --- epochs, fenced after the owner ----------------------------------------------------

    async def raise_epoch_of(
        self, space: Space, new_log: bool = False, conv: str | None = None
    ) -> None:
        """Advance the Space to this session's epoch (killing older commands); the first
        time in this driver, only once its owner record says it may (``judge``)."""
        caps = await self.capabilities(space)
        if not caps.exec_ledger:
            raise HaltError(
                f"Space {space.name} does not report process.exec_ledger", permanent=True
            )
        if space.name not in self._epochs:
            await self.judge(space, conv)
        current = await space.current_epoch()
        target = self.epoch_for(space.name)
        if new_log and current == target and space.name not in self._epochs:
            target += 1  # another log already used this epoch on this Space
        if current > target:
            raise self._stale(StaleEpochError(target, current, "space"))
        try:
            await space.advance_epoch(target)
        except StaleEpochError as e:
            raise self._stale(e) from None
        except (SpaceUnavailableError, OSError) as e:
            raise HaltError(f"cannot raise the epoch of Space {space.name}: {e}") from e
        self._epochs[space.name] = target

    async def raise_epoch(self, name: str) -> None:
        """Raise the epoch of the named Space now, if it exists (the driver's first act)."""
        space = self.open.get(name) or await self.config.spaces.find(name)
        if space is None:
            return
        self.open[name] = space
        await self.raise_epoch_of(space)

    # --- finding ------------------------------------------------------------------------

    async def find_or_create(self, name: str) -> tuple[Space, bool]:
        """The Space (found open, found, or created empty) and whether it was missing."""
        space = self.open.get(name) or await self.config.spaces.find(name)
        if space is not None:
            return space, False
        return await self.config.spaces.create(name), True

    async def space(self, conversation_id: str) -> Space:
        """The conversation's Space as it is now, fenced (for unwrapped tools)."""
        name = self.name_for(conversation_id)
        space, _ = await self.find_or_create(name)
        if not self.fenced(name):
            await self.raise_epoch_of(space, conv=conversation_id)
        self.open[name] = space
        return space
