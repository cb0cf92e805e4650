"""Where a wrapped call's time goes: a ``PHASES`` line per (mode, backend, tool, size).

``Phases.install()`` wraps a few functions of the adapter and the spacesd backend with
timers (a ``perf_counter`` pair each: microseconds against calls of milliseconds) that
count only while ``active`` is set, i.e. during the wrapped calls, never the unwrapped
twins. Per wrapped call it prints the mean of each phase in ms and the number of
daemon round trips (``rpc``: request/response calls of the SDK; ``events``: the output
stream's events of a command), so an issue can say which part to cut::

    PHASES mode=<m> backend=<b> tool=<t> files=<n> call_ms=<x> commits=<k> commit_ms=<x>
           rpc=<k> rpc_ms=<x> rpcs=<method:k,...> events=<k> effect_ms=<x> scan_ms=<x>
           checkpoint_ms=<x> walk_ms=<x> store_ms=<x> fsyncs=<k> thread_wait_ms=<x>

Phases nest (the effect holds its round trips, the checkpoint its walk and store
commit), so they do not add up to ``call_ms``. ``thread_wait_ms`` is the time
``asyncio.to_thread`` work waited to start and to hand its result back (the hand-off,
not the work). Timing is bench instrumentation only: nothing here changes behaviour.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: (module path, attribute path, phase name): what is timed.
TIMED = (
    ("durable_spaces.harness.log_sqlite", "SqliteStorage.append", "commit"),
    ("durable_spaces.adapter.effects", "Effect.command", "effect"),
    ("durable_spaces.adapter.effects", "Effect.file_op", "effect"),
    ("durable_spaces.backends.spacesd.backend", "NamespacedSpace.scan", "scan"),
    ("durable_spaces.backends.local.local_space", "LocalSpace.scan", "scan"),
    ("durable_spaces.adapter.checkpointing", "CheckpointKeeper.take", "checkpoint"),
    ("durable_spaces.adapter.checkpoints.incremental", "walk_host", "walk"),
    ("durable_spaces.adapter.checkpoints.kept_tree", "KeptTree.relook", "walk"),
    ("durable_spaces.adapter.checkpoints.store", "Batch._commit", "store"),
    # finer parts, printed as ``more=``
    ("durable_spaces.adapter.checkpoints.incremental", "Taker._host_sync", "host_sync"),
    ("durable_spaces.adapter.checkpoints.incremental", "Taker._heal_host", "heal"),
    ("durable_spaces.host.holders", "Holders.now", "holders"),
    ("durable_spaces.adapter.checkpoints.kept_tree", "KeptTree.changes", "journal_sync"),
    ("durable_spaces.adapter.checkpoints.manifest_build", "Builder.build", "manifest"),
    ("durable_spaces.adapter.checkpoints.manifest", "encode", "encode"),
    ("durable_spaces.adapter.checkpoints.manifest", "Encoder.encode", "encode"),
    ("durable_spaces.adapter.checkpointing", "CheckpointKeeper.prune", "prune"),
    ("durable_spaces.adapter.checkpoints.space_copy", "prune", "copy_prune"),
    ("durable_spaces.adapter.checkpoints.copies", "Copies.manifest", "read_manifest"),
    ("durable_spaces.adapter.image_log", "update", "image_update"),
    ("durable_spaces.adapter.space_state", "load", "state_load"),
    ("durable_spaces.adapter.space_state", "commit", "state_commit"),
    ("durable_spaces.adapter.modes", "ModeDecider.decide", "decide"),
    ("durable_spaces.adapter.durable", "DurableSpaces.space_for", "space_for"),
)
MORE = (
    "host_sync", "heal", "holders", "journal_sync", "manifest", "encode", "prune",
    "copy_prune", "read_manifest", "image_update", "state_load",
    "state_commit", "decide", "space_for",
)  # fmt: skip


class Phases:
    def __init__(self) -> None:
        self.active = False
        self.ms: defaultdict[str, float] = defaultdict(float)
        self.n: Counter[str] = Counter()
        self.rpcs: Counter[str] = Counter()
        self.calls = 0
        self._undo: list[Callable[[], None]] = []

    # --- counting --------------------------------------------------------------------

    @contextmanager
    def call(self) -> Iterator[None]:
        """Count what happens inside as one wrapped call."""
        self.active = True
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.ms["call"] += (time.perf_counter() - t0) * 1000
            self.calls += 1
            self.active = False

    def reset(self) -> None:
        self.ms.clear()
        self.n.clear()
        self.rpcs.clear()
        self.calls = 0

    def add(self, phase: str, t0: float) -> None:
        if self.active:
            self.ms[phase] += (time.perf_counter() - t0) * 1000
            self.n[phase] += 1

    def line(self, mode: str, backend: str, tool: str, files: int) -> str:
        c = max(1, self.calls)

        def ms(k: str) -> str:
            return f"{self.ms[k] / c:.2f}"

        def per(k: str) -> str:
            return f"{self.n[k] / c:g}"

        rpcs = ",".join(
            f"{k}:{v / c:g}/{self.ms['rpc:' + k] / c:.2f}ms" for k, v in sorted(self.rpcs.items())
        )
        more = ",".join(f"{k}:{self.ms[k] / c:.2f}" for k in MORE if self.n[k])
        return (
            f"PHASES mode={mode} backend={backend} tool={tool} files={files} "
            f"call_ms={ms('call')} commits={per('commit')} commit_ms={ms('commit')} "
            f"rpc={per('rpc')} rpc_ms={ms('rpc')} rpcs={rpcs} events={per('event')} "
            f"effect_ms={ms('effect')} scan_ms={ms('scan')} checkpoint_ms={ms('checkpoint')} "
            f"walk_ms={ms('walk')} store_ms={ms('store')} fsyncs={per('fsync')} "
            f"thread_wait_ms={ms('thread_wait')} more={more or 'none'}"
        )

    # --- installing the timers ---------------------------------------------------------

    def install(self) -> None:
        import importlib

        for mod_name, attr, phase in TIMED:
            try:
                mod = importlib.import_module(mod_name)
            except ImportError:
                continue
            owner: Any = mod
            *path, name = attr.split(".")
            for p in path:
                owner = getattr(owner, p, None)
            if owner is None or not hasattr(owner, name):
                continue
            self._wrap(owner, name, phase)
        self._wrap_rpc()
        self._wrap_fsync()
        self._wrap_to_thread()

    def uninstall(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def _patch(self, owner: Any, name: str, new: Any) -> None:
        own = name in vars(owner)
        old = vars(owner).get(name)
        setattr(owner, name, new)
        self._undo.append(lambda: setattr(owner, name, old) if own else delattr(owner, name))

    def _wrap(self, owner: Any, name: str, phase: str) -> None:
        fn = getattr(owner, name)
        me = self
        if asyncio.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def timed_async(*a: Any, **kw: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return await fn(*a, **kw)
                finally:
                    me.add(phase, t0)

            self._patch(owner, name, timed_async)
            return

        @functools.wraps(fn)
        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                me.add(phase, t0)

        self._patch(owner, name, timed)

    def _wrap_rpc(self) -> None:
        try:
            from durable_spaces.backends.spacesd import execution
            from durable_spaces.backends.spacesd import spacesd_space as space
        except ImportError:
            return
        me = self
        call = space.SpacesdSpace._call

        async def timed_call(obj: Any, method: str, *a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await call(obj, method, *a, **kw)
            finally:
                if me.active:
                    sub = a[0].split("/")[-1] if method == "call_json" and a else method
                    me.rpcs[sub] += 1
                    me.ms["rpc:" + sub] += (time.perf_counter() - t0) * 1000
                me.add("rpc", t0)

        self._patch(space.SpacesdSpace, "_call", timed_call)
        nxt = execution.SpacesdExecution._next_event

        async def timed_event(obj: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await nxt(obj)
            finally:
                me.add("event", t0)

        self._patch(execution.SpacesdExecution, "_next_event", timed_event)

    def _wrap_fsync(self) -> None:
        me = self
        real = os.fsync

        def fsync(fd: Any) -> None:
            t0 = time.perf_counter()
            try:
                real(fd)
            finally:
                me.add("fsync", t0)

        os.fsync = fsync
        self._undo.append(lambda: setattr(os, "fsync", real))

    def _wrap_to_thread(self) -> None:
        me = self
        real = asyncio.to_thread

        async def to_thread(func: Any, /, *a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            marks: list[float] = []

            def run() -> Any:
                marks.append(time.perf_counter())
                try:
                    return func(*a, **kw)
                finally:
                    marks.append(time.perf_counter())

            try:
                return await real(run)
            finally:
                if me.active and len(marks) == 2:
                    waited = (marks[0] - t0) + (time.perf_counter() - marks[1])
                    me.ms["thread_wait"] += waited * 1000
                    me.n["thread"] += 1

        asyncio.to_thread = to_thread
        self._undo.append(lambda: setattr(asyncio, "to_thread", real))
