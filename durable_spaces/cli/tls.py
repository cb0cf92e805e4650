"""``durable-spaces tls ...``: the cluster's CA, enrolment, rotation and revocation.

Each command only parses options; ``durable_spaces/cluster/enrol.py`` does the work (the
flow, and why the CA's key never enters the store: ``durable_spaces/cluster/pki.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from durable_spaces.cli.app import app, fail
from durable_spaces.cli.cluster import Db, cluster_errors

if TYPE_CHECKING:
    from durable_spaces.cluster.store import ClusterStore

tls_app = typer.Typer(
    help="The cluster's certificates: a CA, enrolment, rotation, revocation.",
    no_args_is_help=True,
)
app.add_typer(tls_app, name="tls")

CaDir = Annotated[Path, typer.Option(help="the CA's directory (its key stays there)")]
TlsDirOpt = Annotated[
    Path, typer.Option(envvar="DS_CLUSTER_TLS_DIR", help="this machine's TLS directory")
]
Days = Annotated[int, typer.Option(help="how long a certificate is valid")]


def _in_store(db: str, work: Callable[[ClusterStore], list[str] | str]) -> None:
    """``work`` on the store at ``db``, its lines printed; every error one line."""
    from durable_spaces.cluster.store import ClusterStore

    try:
        with ClusterStore(db) as store:
            lines = work(store)
    except cluster_errors() as e:
        raise fail(str(e)) from None
    for line in [lines] if isinstance(lines, str) else lines:
        typer.echo(line)


@tls_app.command("init")
def init(db: Db, ca_dir: CaDir, days: Days = 3650) -> None:
    """Make the cluster CA (once, on the operator's machine) and print the enrolment line."""
    from durable_spaces.cluster import enrol

    _in_store(db, lambda store: enrol.init(store, ca_dir, days=days))


@tls_app.command("enroll")
def enroll(
    db: Db,
    role: Annotated[str, typer.Option(help="host, coordinator or worker")],
    enrol_id: Annotated[str, typer.Option("--id", help="its id in the cluster")],
    tls_dir: TlsDirOpt,
    ca: Annotated[str | None, typer.Option(help="the CA's sha256: fingerprint")] = None,
    ca_dir: Annotated[Path | None, typer.Option(help="issue at once with this CA")] = None,
    wait: Annotated[float, typer.Option(help="seconds to wait for approval")] = 900.0,
    days: Days = 365,
) -> None:
    """Enrol this machine: a key made here, a certificate once the operator approves."""
    from durable_spaces.cluster import enrol
    from durable_spaces.cluster.pki import identity

    try:
        who = identity(role, enrol_id)  # a bad name before any connection
    except cluster_errors() as e:
        raise fail(str(e)) from None

    def work(store: ClusterStore) -> str:
        return enrol.enroll(
            store, tls_dir, who, pin=ca, ca_dir=ca_dir, days=days, wait_secs=wait,
            echo=typer.echo,
        )  # fmt: skip

    _in_store(db, work)


@tls_app.command("renew")
def renew(
    db: Db,
    tls_dir: TlsDirOpt,
    ca_dir: Annotated[Path | None, typer.Option(help="issue at once with this CA")] = None,
    wait: Annotated[float, typer.Option(help="seconds to wait for approval")] = 900.0,
    days: Days = 365,
) -> None:
    """Rotate this machine's key and certificate (same identity, approved like enroll)."""
    from durable_spaces.cluster import enrol

    _in_store(
        db,
        lambda store: enrol.renew(
            store, tls_dir, ca_dir=ca_dir, days=days, wait_secs=wait, echo=typer.echo
        ),
    )


@tls_app.command("approve")
def approve(
    db: Db,
    ca_dir: CaDir,
    approve_id: Annotated[str | None, typer.Option("--id", help="the requester's id")] = None,
    role: Annotated[str | None, typer.Option(help="host, coordinator or worker")] = None,
    request: Annotated[int | None, typer.Option(help="one request by number")] = None,
    every: Annotated[bool, typer.Option("--all", help="every pending request")] = False,
    days: Days = 365,
) -> None:
    """Issue pending requests (compare each key fingerprint with what enroll printed)."""
    from durable_spaces.cluster import enrol

    _in_store(
        db,
        lambda store: enrol.approve(
            store, ca_dir, who_id=approve_id, role=role, request=request, every=every,
            days=days,
        ),
    )  # fmt: skip


@tls_app.command("revoke")
def revoke(
    db: Db,
    ca_dir: CaDir,
    serial: Annotated[list[str] | None, typer.Option(help="a certificate's serial")] = None,
    revoke_id: Annotated[str | None, typer.Option("--id", help="every one of this id")] = None,
    role: Annotated[str | None, typer.Option(help="host, coordinator or worker")] = None,
) -> None:
    """Revoke certificates: a new revocation list every party reads within seconds."""
    from durable_spaces.cluster import enrol

    _in_store(
        db,
        lambda store: enrol.revoke(
            store, ca_dir, serials=serial or [], who_id=revoke_id, role=role
        ),
    )


@tls_app.command("list")
def listing(db: Db) -> None:
    """The CA, every certificate issued (valid, expired, revoked) and waiting requests."""
    from durable_spaces.cluster import enrol

    _in_store(db, enrol.listing)
