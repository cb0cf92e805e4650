"""``quarantine list`` and ``quarantine restore``: what recovery kept aside, and getting it
back (``durable_spaces/adapter/quarantine.py``: a revert or restore first keeps, in a
quarantine checkpoint, whatever it would delete that nothing else held).

``restore`` writes a quarantine's files into a new directory and never into the Space:
a Space belongs to its driver (whose epoch fences every change), and what to put back
where is the user's to decide, with the files in hand."""

from __future__ import annotations

import asyncio
import datetime
import os
import posixpath
from pathlib import Path
from typing import Annotated

import typer

from durable_spaces.campaigns.spec import BACKENDS
from durable_spaces.cli.app import app, fail
from durable_spaces.errors import DurableSpacesError, ReviewError

quarantine_app = typer.Typer(
    help="What a revert or restore kept aside (nothing else held it): list it, get it back.",
    no_args_is_help=True,
)
app.add_typer(quarantine_app, name="quarantine")

StateDir = Annotated[
    Path, typer.Argument(help="a session's state directory (log.sqlite or log.jsonl)")
]
Backend = Annotated[str | None, typer.Option(help="Space backend (default: agent.json)")]
BackendDir = Annotated[Path | None, typer.Option(help="the backend's state dir")]
Store = Annotated[Path | None, typer.Option(help="a DirectoryCheckpointStore")]


def _checked(state_dir: Path, backend: str | None, dirs: dict[str, Path | None]) -> None:
    if not state_dir.is_dir():
        raise fail(f"STATE_DIR {state_dir} is not a directory")
    for option, d in dirs.items():
        if d is not None and not d.is_dir():  # opening a backend would create it
            raise fail(f"{option} {d} is not a directory")
    if backend is not None and backend not in BACKENDS:
        raise fail(f"--backend={backend!r} is not one of: {', '.join(BACKENDS)}")


def _day(t: int) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@quarantine_app.command("list")
def list_cmd(
    state_dir: StateDir,
    backend: Backend = None,
    backend_dir: BackendDir = None,
    store: Store = None,
) -> None:
    """Every quarantine of the session's log: checkpoint, when, why, Space, what it kept."""
    _checked(state_dir, backend, {"--backend-dir": backend_dir, "--store": store})
    try:
        lines = asyncio.run(_list(state_dir, backend, backend_dir, store))
    except (DurableSpacesError, OSError, KeyError) as e:
        raise fail(str(e), 1) from None
    typer.echo("\n".join(lines) if lines else "no quarantine")


async def _list(
    state_dir: Path, backend: str | None, backend_dir: Path | None, store: Path | None
) -> list[str]:
    from durable_spaces.adapter.review import quarantines
    from durable_spaces.cli.review_diff import open_session

    out = []
    async with open_session(state_dir, backend, backend_dir, store) as (harness, durable):
        days = durable.config.settings.quarantine_days
        for conv in harness.conversations():
            for k in quarantines(harness, conv.id):
                more = f" and {k.count - len(k.paths)} more" if k.count > len(k.paths) else ""
                out.append(
                    f"{k.checkpoint} {conv.id} {_day(k.at)} {k.why} space={k.space} "
                    f"kept until {_day(k.expires(days))}: {', '.join(k.paths)}{more}"
                )
    return out


@quarantine_app.command("restore")
def restore_cmd(
    state_dir: StateDir,
    checkpoint: Annotated[str, typer.Argument(help="the quarantine's checkpoint (from list)")],
    to: Annotated[Path, typer.Option("--to", help="a new (or empty) directory to write to")],
    backend: Backend = None,
    backend_dir: BackendDir = None,
    store: Store = None,
) -> None:
    """Write the files a quarantine keeps into a new directory (never into the Space)."""
    from durable_spaces.adapter.checkpoints.ids import CheckpointId

    _checked(state_dir, backend, {"--backend-dir": backend_dir, "--store": store})
    if CheckpointId.valid(checkpoint) is None:
        raise fail(f"CHECKPOINT {checkpoint[:80]!r} is not a checkpoint id")
    if to.is_symlink() or (to.exists() and (not to.is_dir() or any(to.iterdir()))):
        raise fail(f"--to {to} exists and is not an empty directory: nothing is overwritten")
    try:
        n = asyncio.run(_restore(state_dir, checkpoint, to, backend, backend_dir, store))
    except (DurableSpacesError, OSError, KeyError) as e:
        raise fail(str(e), 1) from None
    typer.echo(f"restored {n} paths of {checkpoint} to {to}")


async def _restore(
    state_dir: Path,
    checkpoint: str,
    to: Path,
    backend: str | None,
    backend_dir: Path | None,
    store: Path | None,
) -> int:
    from durable_spaces.adapter.review import SYMLINK, quarantined, quarantines
    from durable_spaces.cli.review_diff import open_session

    async with open_session(state_dir, backend, backend_dir, store) as (harness, durable):
        owner = next(
            (
                c.id
                for c in harness.conversations()
                if any(k.checkpoint == checkpoint for k in quarantines(harness, c.id))
            ),
            None,
        )
        if owner is None:
            raise ReviewError(f"{checkpoint} is no quarantine of the log in {state_dir}")
        files = await quarantined(harness, durable, owner, checkpoint)
    to.mkdir(mode=0o700, parents=True, exist_ok=True)
    for path, data in sorted(files.items()):
        parts = path.split("/")
        if posixpath.isabs(path) or ".." in parts or "" in parts:  # checked on read; again
            raise ReviewError(f"the quarantine names a path outside it: {path[:80]!r}")
        dest = to.joinpath(*parts)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if data.startswith(SYMLINK):
            os.symlink(os.fsdecode(data[len(SYMLINK) :]), dest)
        else:
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
    return len(files)
