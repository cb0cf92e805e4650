"""The cluster's commands refuse bad options with a message, not a traceback (no
database needed: the options are checked before anything connects)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CLI = (sys.executable, "-m", "durable_spaces.cli")
DB = ("--db", "postgresql://nobody@/none?host=/nonexistent")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["host", *DB, "--id", "h1", "--address", "10.0.0.1:7000", "--backend", "vmware"],
         "host backend 'vmware'"),
        (["host", *DB, "--id", "h1", "--address", "nowhere"], "host address 'nowhere'"),
        (["coordinator", *DB, "--id", "c1", "--sessions-dir", "/tmp", "--backoff", "1,2"],
         "backoff '1,2'"),
        (["coordinator", *DB, "--id", "c 1", "--sessions-dir", "/tmp"], "coordinator 'c 1'"),
        (["submit", *DB, "--sessions-dir", "/tmp", "--name", "s1", "--mode", "bogus"],
         "durable mode 'bogus'"),
        # libpq would take an empty URL for its default server: refused, whoever asks
        (["tls", "list", "--db", ""], "the cluster database URL is empty"),
        (["host", "--db", " ", "--id", "h1", "--address", "10.0.0.1:7000", "--tls-dir", "/x"],
         "the cluster database URL is empty"),
        (["coordinator", "--db", "", "--id", "c1", "--sessions-dir", "/tmp", "--tls-dir", "/x"],
         "the cluster database URL is empty"),
        (["host", *DB, "--id", "h1", "--address", "10.0.0.1:7000"], "needs its TLS directory"),
        (["coordinator", *DB, "--id", "c1", "--sessions-dir", "/tmp"], "needs its TLS directory"),
        (["host", *DB, "--id", "H_1", "--address", "10.0.0.1:7000", "--tls-dir", "/x"],
         "host id 'H_1' cannot name a certificate"),
        (["tls", "enroll", *DB, "--role", "admin", "--id", "a", "--tls-dir", "/x"],
         "role 'admin'"),
    ],
)  # fmt: skip
def test_bad_options_are_one_line_errors(args: list[str], says: str) -> None:
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr, r.stderr
