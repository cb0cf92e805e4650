"""``durable-spaces tls ...`` as an operator runs it (durable_spaces/cluster/enrol.py, real
processes and a real store): a CA made once, a machine enrolled in one line and approved,
its key never leaving it, a CA it was not told refused, rotation and revocation."""

from __future__ import annotations

import re
import stat
import subprocess
import sys
from pathlib import Path

from durable_spaces.cluster.pki import identity
from durable_spaces.cluster.store import ClusterStore
from durable_spaces.cluster.tls import Trust

CLI = (sys.executable, "-m", "durable_spaces.cli")


def _run(*args: str, code: int = 0) -> str:
    r = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == code, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    return r.stdout if code == 0 else r.stderr


def _init(db: str, ca_dir: Path) -> str:
    out = _run("tls", "init", "--db", db, "--ca-dir", str(ca_dir))
    m = re.search(r"^cluster CA (sha256:[0-9a-f]{64}) ", out, re.M)
    assert m is not None, out
    return m[1]


def test_a_machine_enrols_in_one_line_and_the_operator_approves_it(
    pg_url: str, tmp_path: Path
) -> None:
    ca = _init(pg_url, tmp_path / "ca")
    assert stat.S_IMODE((tmp_path / "ca" / "ca.key").stat().st_mode) == 0o600
    tls = tmp_path / "h1-tls"
    enroll = [*CLI, "tls", "enroll", "--db", pg_url, "--role", "host", "--id", "h1"]
    enroll += ["--ca", ca, "--tls-dir", str(tls), "--wait", "120"]
    p = subprocess.Popen(enroll, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        waiting = p.stdout.readline()
        m = re.match(r"request (\d+) for host h1: key (sha256:[0-9a-f]{64}); waiting", waiting)
        assert m is not None, waiting
        approved = _run("tls", "approve", "--db", pg_url, "--ca-dir", str(tmp_path / "ca"),
                        "--id", "h1")  # fmt: skip
        assert "issued host h1: certificate " in approved and m[2] in approved
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert out.startswith("enrolled host h1: certificate ")
    assert stat.S_IMODE((tls / "identity.pem").stat().st_mode) == 0o600
    assert not (tls / "request.key").exists() and not (tls / "request.json").exists()
    assert Trust(tls, expect=identity("host", "h1")).identity == identity("host", "h1")
    with ClusterStore(pg_url) as s:  # the store never saw a private key
        dump = " ".join(
            str(v)
            for t in ("tls_ca", "tls_crl", "tls_certificates", "tls_requests")
            for row in s.db.run(lambda c, t=t: c.execute(f"SELECT * FROM ds.{t}").fetchall())
            for v in row.values()
        )
        assert "PRIVATE KEY" not in dump
    listed = _run("tls", "list", "--db", pg_url)
    assert re.search(r"^[0-9a-f]+ host h1 until .* valid$", listed, re.M), listed


def test_enrolment_trusts_only_the_ca_it_was_told(pg_url: str, tmp_path: Path) -> None:
    _init(pg_url, tmp_path / "ca")
    tls = tmp_path / "tls"
    base = ["tls", "enroll", "--db", pg_url, "--role", "coordinator", "--id", "c1"]
    base += ["--tls-dir", str(tls), "--wait", "0"]
    said = _run(*base, code=2)
    assert "give --ca sha256:" in said
    said = _run(*base, "--ca", "sha256:" + "0" * 64, code=2)
    assert "the store's CA is sha256:" in said and "not sha256:000" in said
    assert not (tls / "identity.pem").exists()
    assert "the cluster already has a CA" in _run(
        "tls", "init", "--db", pg_url, "--ca-dir", str(tmp_path / "another"), code=2
    )


def test_rotation_and_revocation_from_the_command_line(pg_url: str, tmp_path: Path) -> None:
    ca_dir = tmp_path / "ca"
    _init(pg_url, ca_dir)
    tls = tmp_path / "c1-tls"
    # on the machine that holds the CA's key, enrolment is one step
    out = _run("tls", "enroll", "--db", pg_url, "--role", "coordinator", "--id", "c1",
               "--ca-dir", str(ca_dir), "--tls-dir", str(tls))  # fmt: skip
    first = re.search(r"certificate ([0-9a-f]+),", out)
    assert first is not None, out
    out = _run("tls", "renew", "--db", pg_url, "--tls-dir", str(tls), "--ca-dir", str(ca_dir))
    second = re.search(r"enrolled coordinator c1: certificate ([0-9a-f]+),", out)
    assert second is not None and second[1] != first[1], out
    assert f"{Trust(tls).serial:x}" == second[1]
    out = _run("tls", "revoke", "--db", pg_url, "--ca-dir", str(ca_dir), "--serial", first[1])
    assert out.strip() == f"revoked coordinator c1: certificate {first[1]} (revocation list 2)"
    listed = _run("tls", "list", "--db", pg_url)
    assert f"{first[1]} coordinator c1 until" in listed and "revoked" in listed
    assert re.search(rf"^{second[1]} coordinator c1 until .* valid$", listed, re.M)
    said = _run("tls", "revoke", "--db", pg_url, "--ca-dir", str(ca_dir), "--serial", first[1],
                code=2)  # fmt: skip
    assert "nothing to revoke" in said


def test_the_ca_key_is_refused_when_others_may_read_it(pg_url: str, tmp_path: Path) -> None:
    ca_dir = tmp_path / "ca"
    _init(pg_url, ca_dir)
    (ca_dir / "ca.key").chmod(0o644)
    said = _run("tls", "approve", "--db", pg_url, "--ca-dir", str(ca_dir), "--all", code=2)
    assert "may be read by group or others: chmod 600 it" in said
