"""The nemesis: the parts that inflict faults, as small objects over one protocol.

Jepsen's shape: an operation is a plain record (``Op``); a nemesis takes an ``invoke``
op and returns its completion (``ok``, ``fail``, or ``info`` when the outcome is
unknown). Nemeses compose by the op kinds they claim, and two claiming one kind is an
error, so a campaign states exactly who does what. Every completed op is kept with its
times in the composed nemesis's ``history``, which is what a run record counts.

Kinds: ``kill`` (SIGKILL the current driver), ``daemon_kill``, ``space_restart`` and
``space_remove`` (through a ``SpaceBackend``).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from durable_spaces.adapter.space import SpaceBackend


@dataclass(frozen=True)
class Op:
    """One nemesis operation. ``type``: invoke, ok, fail, or info (outcome unknown)."""

    kind: str
    type: str = "invoke"
    value: Any = None
    time_ms: float = field(default_factory=lambda: time.time() * 1000)
    end_ms: float | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "type": self.type,
            "value": self.value,
            "time_ms": self.time_ms,
            "end_ms": self.end_ms,
            "error": self.error,
        }


def _done(op: Op, type_: str, value: Any = None, error: str | None = None) -> Op:
    return replace(
        op,
        type=type_,
        value=op.value if value is None else value,
        end_ms=time.time() * 1000,
        error=error,
    )


class Nemesis(Protocol):
    """Inflicts the op kinds it claims."""

    kinds: frozenset[str]

    async def invoke(self, op: Op) -> Op: ...


class Killable(Protocol):
    """Something with a current driver to SIGKILL (the coordinator)."""

    def kill_current(self, reason: str = ...) -> int | None: ...


class DriverKiller:
    """``kill``: SIGKILL the current driver. ``ok`` with the pid, ``fail`` if none ran."""

    kinds = frozenset({"kill"})

    def __init__(self, target: Killable | Callable[[], int | None]) -> None:
        self._target = target

    async def invoke(self, op: Op) -> Op:
        if hasattr(self._target, "kill_current"):
            pid = self._target.kill_current("nemesis")
        else:
            pid = self._target()
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pid = None
        if pid is None:
            return _done(op, "fail", error="no driver running")
        return _done(op, "ok", value=pid)


class SpaceNemesis:
    """``daemon_kill`` / ``space_restart`` / ``space_remove`` of one named Space.

    A backend error leaves the outcome unknown (``info``): the fault may have happened.
    """

    _METHODS = {"daemon_kill": "kill_daemon", "space_restart": "restart", "space_remove": "delete"}

    def __init__(
        self, backend: SpaceBackend, name: str, kinds: Iterable[str] | None = None
    ) -> None:
        self.backend = backend
        self.name = name
        self.kinds = frozenset(self._METHODS if kinds is None else kinds)
        unknown = self.kinds - set(self._METHODS)
        if unknown:
            raise ValueError(f"SpaceNemesis cannot do {sorted(unknown)}")

    async def invoke(self, op: Op) -> Op:
        method = getattr(self.backend, self._METHODS[op.kind])
        try:
            await method(self.name)
        except Exception as e:
            return _done(op, "info", error=f"{type(e).__name__}: {e}")
        return _done(op, "ok", value=self.name)


class Composed:
    """Routes each op to the one nemesis that claims its kind and records the history."""

    def __init__(self, routes: Mapping[str, Nemesis]) -> None:
        self.routes = dict(routes)
        self.kinds = frozenset(self.routes)
        self.history: list[Op] = []

    async def invoke(self, op: Op) -> Op:
        nem = self.routes.get(op.kind)
        if nem is None:
            raise ValueError(f"no nemesis claims op kind {op.kind!r}")
        done = await nem.invoke(op)
        self.history.append(done)
        return done

    async def inflict(self, kind: str, value: Any = None) -> Op:
        """Shorthand: invoke a fresh op of ``kind``."""
        return await self.invoke(Op(kind, value=value))

    def counts(self, types: Iterable[str] = ("ok", "info")) -> dict[str, int]:
        """Faults per kind that happened (``ok``) or may have (``info``)."""
        keep = set(types)
        c: Counter[str] = Counter(op.kind for op in self.history if op.type in keep)
        return dict(sorted(c.items()))


def compose(nemeses: Mapping[Any, Nemesis] | Iterable[Nemesis]) -> Composed:
    """One nemesis from many, routed by op kind.

    A mapping's keys are a kind or an iterable of kinds each value handles; a plain
    iterable uses each nemesis's own ``kinds``. Two nemeses claiming one kind is an error.
    """
    pairs: list[tuple[Iterable[str], Nemesis]]
    if isinstance(nemeses, Mapping):
        pairs = [([k] if isinstance(k, str) else list(k), n) for k, n in nemeses.items()]
    else:
        pairs = [(n.kinds, n) for n in nemeses]
    routes: dict[str, Nemesis] = {}
    for kinds, nem in pairs:
        for kind in kinds:
            if kind in routes:
                raise ValueError(f"two nemeses claim op kind {kind!r}")
            if kind not in nem.kinds:
                raise ValueError(f"{type(nem).__name__} cannot do {kind!r}")
            routes[kind] = nem
    return Composed(routes)
