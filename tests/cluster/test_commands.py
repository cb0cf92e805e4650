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
    ],
)  # fmt: skip
def test_bad_options_are_one_line_errors(args: list[str], says: str) -> None:
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_host_secret_shows_and_rotates_the_version_never_the_secret(pg_url: str) -> None:
    def run(*extra: str) -> str:
        r = subprocess.run(
            [*CLI, "host-secret", "--db", pg_url, *extra], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    assert run() == "host secret version 1 (accepted: 1)"
    assert run("--rotate") == "host secret version 2 (accepted: 2, 1)"
    assert run("--rotate") == "host secret version 3 (accepted: 3, 2)"
