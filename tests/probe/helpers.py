"""What the probe's tests share: fake harnesses (fakes/) run through the real CLI, in this
process; the no_leftovers fixture (conftest.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from durable_spaces import cli
from durable_spaces.probe.faults import machine_unavailable
from durable_spaces.probe.record import ProbeRecord

FAKES = Path(__file__).parent / "fakes"
#: The kill faults as test parameters: machine needs a cgroup v2, power FUSE.
KILL_FAULTS = [
    "process",
    pytest.param("machine", marks=pytest.mark.skipif(
        machine_unavailable() is not None, reason=str(machine_unavailable()))),
    pytest.param("power", marks=pytest.mark.fuse),
]  # fmt: skip


@dataclass
class Probed:
    code: int
    stdout: str
    stderr: str
    out: Path

    @property
    def summary(self) -> dict[str, str]:
        last = self.stdout.strip().splitlines()[-1]
        assert last.startswith("SUMMARY probe "), self.stdout
        return dict(f.split("=", 1) for f in last.split()[2:])

    def records(self) -> list[ProbeRecord]:
        return [ProbeRecord.load(p) for p in sorted((self.out / "runs").glob("r*.json"))
                if not p.name.endswith(".requests.json")]  # fmt: skip


def probe(out: Path, *args: str) -> Probed:
    r = CliRunner().invoke(cli.app, ["probe", *args, "--out", str(out)])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return Probed(r.exit_code, r.stdout, r.stderr, out)


def fake(name: str) -> str:
    return str(FAKES / name)


#: How fakes/fakeagent.py tells the model a call was interrupted (its recipes' [report]).
REPORT = "interrupted: the call was cut short"


def write_recipe(d: Path, defect: str, extra: Sequence[str] = (), report: str | None = REPORT,
                 **fields: str) -> Path:  # fmt: skip
    """A recipe for fakes/fakeagent.py with ``defect`` (and more of its flags), declaring
    ``report`` as its words for an interrupted call."""
    d.mkdir(parents=True, exist_ok=True)
    agent = FAKES / "fakeagent.py"
    more = "".join(f', "{x}"' for x in extra)
    body = {
        "name": '"fake-test"',
        "launch": f'["{{python}}", "{agent}", "--model-url", "{{model_url}}", "--state", '
                  f'"{{state_dir}}", "--prompt", "{{prompt}}", "--defect", "{defect}"{more}]',
        "resume": f'["{{python}}", "{agent}", "--model-url", "{{model_url}}", "--state", '
                  f'"{{state_dir}}", "--resume", "--defect", "{defect}"{more}]',
        "timeout_s": "30",
    }  # fmt: skip
    body.update(fields)
    text = "".join(f"{k} = {v}\n" for k, v in body.items() if v)
    text += '[tool]\nname = "bash"\nargument = "command"\n'
    if report is not None:
        text += f"[report]\ntext = {json.dumps(report)}\n"
    (d / "recipe.toml").write_text(text)
    return d / "recipe.toml"


def run_processes(under: Path) -> list[int]:
    """Processes a probe run started (they carry PROBE_RUN_TOKEN) that still run in a
    directory under ``under`` (a run's workdir: so a test sees only its own runs')."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes()
                cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
            except OSError:
                continue
            if b"PROBE_RUN_TOKEN=" in env and cwd.is_relative_to(under):
                out.append(int(pid))
    return out


@pytest.fixture
def no_leftovers(tmp_path: Path) -> object:
    yield None
    left = run_processes(tmp_path)
    assert not left, f"processes a probe started still run: {sorted(left)}"
