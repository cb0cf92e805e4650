"""``run_durable_session``: the process a coordinator launches for each drive attempt.

Contract with the coordinator (README.md, "The adapter in code"):

- environment: ``CUA_SESSION_NAME``, ``CUA_SESSION_EPOCH`` (1..2**63-1, ASCII digits),
  ``CUA_SESSION_STATE_DIR`` (absolute; the fenced SQLite log lives there),
  ``CUA_SESSION_HEARTBEAT_SECS`` (default 30; 0.01..threading.TIMEOUT_MAX), optional
  ``CUA_SESSION_SPACE`` (the Space to fence before anything runs); each is checked
  strictly by ``session_env`` before anything is opened or created; optional
  ``DS_LOG_SYNCHRONOUS`` (``NORMAL``, the default, or ``FULL``: the log's SQLite level);
  optional ``DS_LOG_FORMAT`` (``sqlite``, the default, or ``jsonl``: ``log.jsonl`` with
  its marker-file fence, an fsync per commit unless ``DS_LOG_SYNCHRONOUS=OFF``);
- exit codes: 0 done, 78 permanent (bad environment, ``PermanentFailure``, a submission
  that ended unanswered, a Space that cannot be fenced for good), 75 fenced (a newer
  epoch exists; returned as soon as the log's fence refuses, even if the run never
  settles), anything else crashed (resume with backoff);
- ``CUA-HEARTBEAT <epoch> <unix_ms>`` every heartbeat interval from a thread of its own,
  so a frozen event loop still beats and a frozen process falls silent;
- ``DS-EVENT <json>`` lines for the lab (first_step, recovery, done).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from durable_spaces.adapter.durable import DurableSpaces
from durable_spaces.adapter.recovery import RecoveryEvent
from durable_spaces.chaos import mutants
from durable_spaces.drive import protocol as sp
from durable_spaces.drive.protocol import (
    EXIT_CRASHED,
    EXIT_DONE,
    EXIT_FENCED,
    EXIT_PERMANENT,
    MAX_HEARTBEAT_S,
    MIN_HEARTBEAT_S,
    check_state_dir,
    event_line,
    heartbeat_line,
    make_state_dir,
    parse_epoch,
    parse_name,
    parse_seconds,
    parse_space,
)
from durable_spaces.errors import (
    ConfigError,
    HaltError,
    PermanentFailure,
    StaleEpochError,
)
from durable_spaces.harness.log import Fence, Storage, open_fenced_jsonl, open_fenced_sqlite
from durable_spaces.settings import Settings

LOG_FILE = "log.sqlite"
JSONL_LOG_FILE = "log.jsonl"


@dataclass(frozen=True)
class Session:
    name: str
    epoch: int
    state_dir: Path
    heartbeat_secs: float
    space: str | None = None

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None) -> Session:
        """Read and validate the driver's environment (``session_env``: strict, nothing
        created); ``ConfigError`` names the culprit."""
        e = os.environ if env is None else env
        name = parse_name("CUA_SESSION_NAME", e.get("CUA_SESSION_NAME", ""))
        raw = e.get("CUA_SESSION_EPOCH")
        if raw is None or raw == "":
            raise ConfigError("CUA_SESSION_EPOCH is not set")
        epoch = parse_epoch("CUA_SESSION_EPOCH", raw)
        sd = check_state_dir("CUA_SESSION_STATE_DIR", e.get("CUA_SESSION_STATE_DIR", ""))
        hb = parse_seconds(
            sp.HEARTBEAT_SECS,
            e.get(sp.HEARTBEAT_SECS, sp.DEFAULT_HEARTBEAT_SECS),
            lo=MIN_HEARTBEAT_S,
            hi=MAX_HEARTBEAT_S,
        )
        space = e.get(sp.SPACE) or None
        if space is not None:
            space = parse_space(sp.SPACE, space)
        return Session(name, epoch, sd, hb, space)


def read_session() -> Session:
    """The session of this process's environment, its state directory made (0700) if
    missing; ``ConfigError`` for anything wrong (the driver exits 78)."""
    session = Session.from_env()
    make_state_dir(sp.STATE_DIR, session.state_dir)
    return session


def bad_environment(err: ConfigError) -> int:
    """Report a bad environment in one line on stderr; the exit code to return (78)."""
    print(f"durable-spaces driver: bad environment: {err}", file=sys.stderr)
    return EXIT_PERMANENT


@dataclass
class StartContext:
    """What ``start`` gets: the session, its fenced log, and the stale callback."""

    session: Session
    log: Storage
    fence: Fence
    on_stale: Callable[[StaleEpochError], None]
    durable: DurableSpaces


@dataclass
class SessionHandle:
    """What ``start`` returns: wait for the submission, close, and (optionally) make sure
    the Space is consistent after the run settled."""

    wait: Callable[[], Awaitable[Any]]
    close: Callable[[], Awaitable[None]]
    ensure_space: Callable[[], Awaitable[None]] | None = None


Start = Callable[[StartContext], Awaitable[SessionHandle]]


def emit_event(event: str, **fields: Any) -> None:
    sys.stdout.write(event_line(event, **fields))
    sys.stdout.flush()


def _orphaned() -> NoReturn:
    """Nobody reads our heartbeats any more: the coordinator that launched us died. Stop
    at once, as a SIGKILL would (whatever call is in flight is recovered by the next
    driver, under a newer epoch: that is the crash this system is built for), with one
    line instead of a BrokenPipe traceback, and never as a driver nobody supervises."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(
            "durable-spaces driver: orphaned: the coordinator's pipe closed; exiting\n"
        )
        sys.stderr.flush()
    os._exit(EXIT_FENCED)


class Heartbeat:
    """Prints ``CUA-HEARTBEAT`` from its own thread until stopped."""

    def __init__(self, epoch: int, every: float) -> None:
        self.epoch = epoch
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cua-heartbeat", daemon=True)

    def _run(self) -> None:
        while True:
            try:
                sys.stdout.write(heartbeat_line(self.epoch))
                sys.stdout.flush()
            except (BrokenPipeError, ValueError):
                _orphaned()
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()


def run_durable_session(durable: DurableSpaces, start: Start) -> int:
    """Run one drive attempt; return the exit code (the caller ``sys.exit``s it)."""
    try:
        session = read_session()
    except ConfigError as e:
        return bad_environment(e)
    with Heartbeat(session.epoch, session.heartbeat_secs):
        try:
            return asyncio.run(_drive(durable, start, session))
        except StaleEpochError as e:
            print(f"durable-spaces driver: fenced: {e}", file=sys.stderr)
            return EXIT_FENCED
        except (PermanentFailure, ConfigError) as e:
            print(f"durable-spaces driver: permanent failure: {e}", file=sys.stderr)
            return EXIT_PERMANENT
        except HaltError as e:
            print(f"durable-spaces driver: halted: {e}", file=sys.stderr)
            return EXIT_PERMANENT if e.permanent else EXIT_CRASHED
        except Exception:
            traceback.print_exc()
            return EXIT_CRASHED


def _open_log(session: Session, settings: Settings) -> tuple[Storage, Fence]:
    """The session's log as ``settings`` ask (``DS_LOG_FORMAT``/``DS_LOG_SYNCHRONOUS``,
    checked when they were read: module doc)."""
    sync = settings.log_synchronous
    if settings.log_format == "jsonl":
        return open_fenced_jsonl(
            str(session.state_dir / JSONL_LOG_FILE), session.epoch, fsync=sync != "OFF"
        )
    return open_fenced_sqlite(str(session.state_dir / LOG_FILE), session.epoch, synchronous=sync)


async def _drive(durable: DurableSpaces, start: Start, session: Session) -> int:
    storage, fence = _open_log(session, durable.config.settings)
    fenced = asyncio.Event()

    def on_stale(err: StaleEpochError) -> None:
        fenced.set()

    chained = durable.config.on_recovery
    first = [True]

    def on_recovery(ev: RecoveryEvent) -> None:
        kept = {"quarantine": ev.detail["quarantine"]} if "quarantine" in ev.detail else {}
        emit_event("recovery", kind=ev.kind, mode=ev.mode, call=ev.call, **kept)
        if chained is not None:
            chained(ev)

    def on_call(tool: str, call: str) -> None:
        if first[0]:
            first[0] = False
            emit_event("first_step", epoch=session.epoch, tool=tool, call=call)

    # This attempt's copy of the adapter: its epoch, the session's namespace, the log's
    # fence and the driver's callbacks (``start`` gets it as ``ctx.durable``).
    durable = durable.for_session(
        log_id=storage.identity,  # known before the harness opens: a placed Space is judged
        epoch=session.epoch,
        namespace=session.name,
        fence=fence,
        on_stale=on_stale,
        on_recovery=on_recovery,
        on_call=on_call,
    )
    try:
        fence.check()  # a newer driver already exists: stop before doing anything
        advance = getattr(fence, "advance", None)
        if advance is not None:
            advance()  # raise the log's floor now: an older driver's next commit is refused
        if session.space:
            try:
                await durable.raise_epoch(session.space)
            except HaltError:
                fence.halt("the Space cannot be fenced")
                raise
        handle = await start(StartContext(session, storage, fence, on_stale, durable))
        try:
            result = await _wait_or_fenced(handle.wait(), fence, fenced)
            if result is None:
                return EXIT_FENCED
            status = getattr(result, "status", "done")
            if status != "done":
                print(
                    f"durable-spaces driver: submission ended {status}: "
                    f"{getattr(result, 'error', '')}",
                    file=sys.stderr,
                )
                return EXIT_PERMANENT
            if handle.ensure_space is not None:
                await handle.ensure_space()
            emit_event("done", epoch=session.epoch)
            return EXIT_DONE
        except HaltError:
            fence.halt("halted")
            raise
        finally:
            with contextlib.suppress(Exception):
                await handle.close()
            with contextlib.suppress(Exception):
                await durable.close()
    finally:
        storage.close()


async def _wait_or_fenced(
    waiting: Awaitable[Any], fence: Fence, fenced: asyncio.Event
) -> Any | None:
    """The submission's result, or None as soon as the log's fence refuses this epoch."""
    task = asyncio.ensure_future(waiting)
    try:
        poll = not mutants.active("no_fence_poll")
        while not task.done():
            if fenced.is_set():
                return None
            try:
                if poll:
                    fence.check()
            except StaleEpochError:
                return None
            await asyncio.wait({task}, timeout=0.2)
        return task.result()
    finally:
        if not task.done():
            task.cancel()
