"""The cluster's commands: ``host``, ``coordinator``, ``submit``, ``worker`` (``tls``:
``durable_spaces/cli/tls.py``).

Each only parses options; ``durable_spaces/cluster/commands.py`` does the work (imported
only when used, so the rest of the CLI runs without a PostgreSQL client).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from durable_spaces.cli.app import app, fail

Db = Annotated[str, typer.Option("--db", envvar="DS_CLUSTER_DB", help="the store's libpq URL")]
TlsDirOption = Annotated[
    Path | None,
    typer.Option(envvar="DS_CLUSTER_TLS_DIR", help="its TLS directory (durable-spaces tls enroll)"),
]


def cluster_errors() -> tuple[type[BaseException], ...]:
    from durable_spaces.errors import DurableSpacesError

    return (DurableSpacesError, OSError)


@app.command()
def host(
    db: Db,
    host_id: Annotated[str, typer.Option("--id", help="this host's id in the store")],
    address: Annotated[str, typer.Option(help="ip:port the host agent's API listens on")],
    backend: Annotated[str, typer.Option(help="spacesd, docker or local")] = "spacesd",
    state_dir: Annotated[Path | None, typer.Option(help="where its Spaces live")] = None,
    listen_host: Annotated[str | None, typer.Option(help="daemons' ip (default: address)")] = None,
    heartbeat_secs: Annotated[float, typer.Option(help="heartbeat interval")] = 1.0,
    sweep_secs: Annotated[float, typer.Option(help="how often Spaces are checked")] = 2.0,
    tls_dir: TlsDirOption = None,
) -> None:
    """Provide durable Spaces to the cluster from this machine."""
    from durable_spaces.cluster.commands import run_host

    try:
        run_host(
            db, host_id, address, backend, state_dir or Path(f"ds-host-{host_id}"),
            tls_dir=tls_dir, listen_host=listen_host, heartbeat_secs=heartbeat_secs,
            sweep_secs=sweep_secs,
        )  # fmt: skip
    except cluster_errors() as e:
        raise fail(str(e)) from None


@app.command()
def coordinator(
    db: Db,
    coordinator_id: Annotated[str, typer.Option("--id", help="this coordinator's id")],
    sessions_dir: Annotated[Path, typer.Option(help="the shared directory of session logs")],
    claim_ttl: Annotated[float, typer.Option(help="seconds a claim lasts unrenewed")] = 10.0,
    stall_secs: Annotated[float, typer.Option(help="driver silence before a kill")] = 60.0,
    backoff: Annotated[str, typer.Option(help="initial,max,factor seconds")] = "2,60,2",
    max_attempts: Annotated[int, typer.Option(help="drives per session at most")] = 20,
    max_sessions: Annotated[int, typer.Option(help="sessions driven at once")] = 4,
    lost_host_secs: Annotated[float, typer.Option(help="heartbeat age of a lost host")] = 5.0,
    driver: Annotated[str | None, typer.Option(help="driver command (default: agent)")] = None,
    tls_dir: TlsDirOption = None,
) -> None:
    """Claim durable sessions from the store and drive them (any number may run)."""
    from durable_spaces.cluster.commands import backoff_triple, driver_argv, run_coordinator
    from durable_spaces.cluster.drive import DriveSettings

    try:
        settings = DriveSettings(
            stall_secs=stall_secs, backoff=backoff_triple(backoff), max_attempts=max_attempts,
            claim_ttl=claim_ttl, max_sessions=max_sessions, lost_host_secs=lost_host_secs,
            tls_dir=tls_dir,
        )  # fmt: skip
        argv = driver_argv(driver)
        if argv is not None:
            settings.argv = argv
        run_coordinator(db, coordinator_id, sessions_dir, settings)
    except cluster_errors() as e:
        raise fail(str(e)) from None


@app.command()
def submit(
    db: Db,
    sessions_dir: Annotated[Path, typer.Option(help="the shared directory of session logs")],
    name: Annotated[str, typer.Option(help="the session's name")],
    space: Annotated[str | None, typer.Option(help="its durable Space (created if new)")] = None,
    seed: Annotated[str, typer.Option(help="the scripted agent's seed")] = "s1",
    calls: Annotated[int, typer.Option(help="scripted calls")] = 6,
    mode: Annotated[str, typer.Option(help="transactional, checkpoint or auto")] = "transactional",
    checkpoint_dir: Annotated[Path | None, typer.Option(help="a shared checkpoint store")] = None,
    wait: Annotated[float | None, typer.Option(help="wait up to this many seconds")] = None,
) -> None:
    """Submit a scripted durable session (the lab's agent) to the cluster."""
    from durable_spaces.campaigns.cluster.commands import run_submit

    try:
        typer.echo(run_submit(
            db, sessions_dir, name, space=space, seed=seed, calls=calls, mode=mode,
            checkpoint_dir=checkpoint_dir, wait_secs=wait,
        ))  # fmt: skip
    except cluster_errors() as e:
        raise fail(str(e)) from None


@app.command()
def worker(
    db: Db,
    worker_id: Annotated[str, typer.Option("--id", help="this worker's id")],
    work_dir: Annotated[Path, typer.Option(help="where runs keep their state here")],
    campaign: Annotated[str | None, typer.Option(help="only this campaign's runs")] = None,
    claim_ttl: Annotated[float, typer.Option(help="seconds a run's claim lasts")] = 30.0,
    until_empty: Annotated[bool, typer.Option(help="stop once every run is done")] = False,
) -> None:
    """Pull campaign runs from the store's queue, run them, store their records."""
    from durable_spaces.campaigns.cluster.commands import run_worker

    try:
        n = run_worker(
            db, worker_id, work_dir, campaign=campaign, claim_ttl=claim_ttl,
            until_empty=until_empty,
        )  # fmt: skip
    except cluster_errors() as e:
        raise fail(str(e)) from None
    typer.echo(f"{n} runs stored")
