"""Spare campaign workers (campaigns/worker_spares.py, worker.py --spare): real
processes."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from campaign_toys import always_ok

from durable_spaces.campaigns.record import RunRecord
from durable_spaces.campaigns.runner import _worker_env, run_campaign
from durable_spaces.campaigns.spec import CampaignSpec
from durable_spaces.campaigns.worker_spares import WorkerSpares

TOY = "campaign_toys:always_ok"


def _spare(args: list[str], line: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "durable_spaces.campaigns.worker", "--spare", *args],
        input=line,
        capture_output=True,
        env=_worker_env(),
        timeout=60,
    )


def test_a_spare_runs_the_run_its_line_names(tmp_path: Path) -> None:
    spec = CampaignSpec(seed_base="sw", runs=1, calls=1).run(0, str(tmp_path / "state"))
    (tmp_path / "spec.json").write_text(json.dumps(spec.to_json()))
    line = json.dumps(
        {"spec": str(tmp_path / "spec.json"), "out": str(tmp_path / "rec.json"),
         "log": str(tmp_path / "run.log")}
    ).encode() + b"\n"  # fmt: skip
    got = _spare([TOY], line)
    assert got.returncode == 0, got.stderr
    assert RunRecord.load(tmp_path / "rec.json").seed == "sw-0"
    assert "campaign worker: warm" in (tmp_path / "run.log").read_text()
    assert got.stdout == b"" and got.stderr == b""  # its output went to the run's log


def test_a_spare_closed_before_any_line_does_nothing(tmp_path: Path) -> None:
    got = _spare([TOY], b"")
    assert (got.returncode, got.stdout, got.stderr) == (0, b"", b"")


@pytest.mark.parametrize(
    "line", [b"not json\n", b'{"spec": "a", "out": "b"}\n', b"[1, 2]\n"], ids=str
)
def test_a_bad_line_ends_a_spare_with_one_line(line: bytes) -> None:
    got = _spare([TOY], line)
    assert got.returncode == 2
    assert got.stderr.decode().startswith("campaign worker: bad launch line:")
    assert b"Traceback" not in got.stderr


@pytest.mark.parametrize(("warm", "zygote"), [("1", "1"), ("1", "0"), ("0", "1")])
def test_the_runner_hands_runs_to_spares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warm: str, zygote: str
) -> None:
    monkeypatch.setenv("DS_WARM_WORKERS", warm)
    monkeypatch.setenv("DS_ZYGOTE", zygote)
    spawned: list[tuple[str, ...]] = []
    spawn = asyncio.create_subprocess_exec

    async def counted(*args: str, **kw: object) -> asyncio.subprocess.Process:
        spawned.append(args)
        return await spawn(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(asyncio, "create_subprocess_exec", counted)
    spec = CampaignSpec(seed_base="sw2", runs=4, calls=1, jobs=2)
    res = run_campaign(spec, always_ok, out_dir=tmp_path, stdout=io.StringIO(), progress=False)
    assert res.exit_code == 0
    logs = sorted((tmp_path / "logs").glob("*.log"))
    warm_runs = [p.name for p in logs if "campaign worker: warm" in p.read_text()]
    assert warm_runs == ([p.name for p in logs] if warm == "1" else [])
    workers = [a for a in spawned if "durable_spaces.campaigns.worker" in a]
    # Forked by the campaign's zygote, no worker is a new interpreter; else all are.
    assert len(workers) == (0 if (warm, zygote) == ("1", "1") else 4)
    assert _running_spares() == [], "a spare worker outlived its campaign"


def _running_spares() -> list[int]:
    """Our descendants that are spare workers and still run. Other tests of this pytest
    worker leave children too (a ``local`` Space's fork server that exited idle is a
    zombie until the next spawn reaps it): a zombie has no command line to read."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = p.cmdline() if p.status() != psutil.STATUS_ZOMBIE else []
            if "--spare" in cmd or "durable_spaces.drive.warm_zygote" in cmd:
                found.append(p.pid)
        except psutil.Error:  # exited, or a zombie, between the listing and the look
            continue
    return found


def test_closing_ends_the_spares_nobody_took() -> None:
    async def go() -> list[int | None]:
        spares = WorkerSpares(TOY, _worker_env(), size=2, total=5)
        spares.fill()
        while len(spares._ready) < 2:  # started (importing, or waiting for their line)
            await asyncio.sleep(0.05)
        procs = [s.process for s in spares._ready]
        await spares.close()
        return [p.returncode for p in procs]

    assert asyncio.run(go()) == [0, 0]  # end of file: exit 0, having run nothing
