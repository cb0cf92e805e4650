"""The private PostgreSQL server (durable_spaces/cluster/pgserver.py) itself."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from pathlib import Path

import psutil
import psycopg
import pytest

from durable_spaces.cluster import pgserver
from durable_spaces.cluster.pgserver import PgServer
from durable_spaces.errors import ConfigError


def postmaster_pid(pg: PgServer) -> int:
    return int((pg.data_dir / "postmaster.pid").read_text().splitlines()[0])


def test_data_survive_stop_start_and_crash_and_close_removes_everything(
    private_pg: PgServer,
) -> None:
    url = private_pg.create_database("keep")
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE TABLE t (v int)")
        c.execute("INSERT INTO t VALUES (1)")
    private_pg.stop()
    assert not private_pg.running()
    private_pg.start()
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("INSERT INTO t VALUES (2)")
    pid = postmaster_pid(private_pg)
    private_pg.crash()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    private_pg.start()
    with psycopg.connect(url) as c:
        assert [r[0] for r in c.execute("SELECT v FROM t ORDER BY v")] == [1, 2]
    base = private_pg.base
    private_pg.close()
    assert not base.exists()
    private_pg.close()  # twice is fine


@pytest.mark.skipif(os.geteuid() != 0, reason="runs as root only: checks the drop to a user")
def test_as_root_the_server_runs_as_an_unprivileged_user_owning_a_private_dir(
    private_pg: PgServer,
) -> None:
    assert private_pg.user in ("postgres", "nobody")
    owner = pwd.getpwnam(private_pg.user)
    st = private_pg.base.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (owner.pw_uid, 0o700)
    assert psutil.Process(postmaster_pid(private_pg)).username() == private_pg.user
    with psycopg.connect(private_pg.url()) as c:  # over the socket in that dir
        row = c.execute("SELECT current_setting('unix_socket_directories')").fetchone()
        assert row is not None and row[0] == str(private_pg.base)
        assert c.execute("SELECT current_setting('listen_addresses')").fetchone() == ("",)


def test_tcp_listens_on_loopback_only_and_wants_the_password() -> None:
    with PgServer(tcp=True) as pg:
        url = pg.url(tcp=True)
        with psycopg.connect(url) as c:
            assert c.execute("SELECT current_setting('listen_addresses')").fetchone() == (
                "127.0.0.1",
            )
        no_password = f"postgresql://postgres@127.0.0.1:{pg.port}/postgres"
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(no_password, connect_timeout=5)
        assert pg._password not in repr(pg)
    with PgServer() as pg, pytest.raises(ConfigError, match="tcp=True"):
        pg.url(tcp=True)


def test_bad_database_names_are_refused(pg_server: PgServer) -> None:
    with pytest.raises(ConfigError, match="database name"):
        pg_server.create_database('x"; DROP DATABASE postgres; --')


def test_missing_binaries_give_a_reason_naming_the_setup_script(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(pgserver.glob, "glob", lambda pattern: [])
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("DS_PG_BINDIR", raising=False)
    assert pgserver.find_binaries() is None
    reason = pgserver.unavailable_reason()
    assert reason is not None and "images/postgres/ci-setup.sh" in reason


def test_a_new_server_object_reopens_a_callers_data_dir_and_leaves_it_in_place() -> None:
    base = Path(tempfile.mkdtemp(prefix="ds-pg-reopen-"))  # not pytest's 0700 root tmp
    try:
        first = PgServer(base, tcp=True)
        first.start()
        with psycopg.connect(first.url(tcp=True), autocommit=True) as c:
            c.execute("CREATE TABLE t (v int)")
            c.execute("INSERT INTO t VALUES (7)")
        first.close()
        assert (base / "data" / "PG_VERSION").exists()  # the caller's dir stays
        again = PgServer(base, tcp=True)  # another port, the same password
        with again, psycopg.connect(again.url(tcp=True)) as c:
            assert c.execute("SELECT v FROM t").fetchall() == [(7,)]
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_socket_only_data_dir_is_not_opened_on_tcp() -> None:
    # initdb --auth=trust trusts loopback too: opening it on tcp would need no password
    base = Path(tempfile.mkdtemp(prefix="ds-pg-sock-"))
    try:
        with PgServer(base):
            pass
        with pytest.raises(ConfigError, match="without tcp=True"):
            PgServer(base, tcp=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="runs as root only: checks the drop to a user")
def test_without_runuser_setpriv_runs_it_as_nobody(monkeypatch: pytest.MonkeyPatch) -> None:
    if pgserver.shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    real_which = pgserver.shutil.which
    monkeypatch.setattr(
        pgserver.shutil, "which", lambda name: None if name == "runuser" else real_which(name)
    )
    with PgServer(user="nobody") as pg:  # nobody's group is nogroup: ids, not names
        assert psutil.Process(postmaster_pid(pg)).username() == "nobody"
        with psycopg.connect(pg.url()) as c:
            assert c.execute("SELECT 1").fetchone() == (1,)
