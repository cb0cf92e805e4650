"""One built-in recipe tried end to end, without the probe core: its ``recipe.toml`` read
as the contract (kept in docs/probe-recipes.md) says, its
launch and resume run in a session of their own with the run's workdir as cwd, against
``durable_spaces.testing``'s chat server answering from the request: step ``k`` is asked
for when the request holds ``k - 1`` tool results, whatever they say (so a resent request
gets the same answer, and the server moves on from a step whatever its result), then a
plain answer.

A trial's kill is ``process`` (SIGKILL of the attempt's process group) or ``machine``
(SIGKILL of the attempt's cgroup: everything it started, wherever it went). Each attempt
runs in a cgroup when this host can make one, so whatever a trial leaves running is
killed at its end either way.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import time
import tomllib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from needs import need

from durable_spaces.host import cgroup as host_cgroup
from durable_spaces.testing import FakeOpenAIServer, text_reply, tool_call_reply

RECIPES = Path(__file__).resolve().parents[3] / "durable_spaces" / "probe" / "recipes"
PROMPT = "Run each command the assistant asks for with your shell tool, one at a time."
FINAL = "All steps are done."
PLACEHOLDERS = ("model_url", "workdir", "state_dir", "run_id", "prompt", "recipe_dir", "python")


@dataclass
class Recipe:
    name: str
    directory: Path
    data: dict[str, Any]

    @property
    def tool(self) -> tuple[str, str]:
        return self.data["tool"]["name"], self.data["tool"]["argument"]


def load(name: str) -> Recipe:
    directory = RECIPES / name
    data = tomllib.loads((directory / "recipe.toml").read_text())
    assert data["name"] == name
    return Recipe(name, directory, data)


def fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    assert "{" not in text or "}" not in text, f"a placeholder left in {text!r}"
    return text


def skip_unless_available(recipe: Recipe, tmp_path: Path) -> None:
    """Skip, with the harness's own words, when its ``available`` command fails (on CI,
    where the probe's harnesses are required, fail: tests/needs.py)."""
    if recipe.name == "pi":
        need("pi")
    elif not recipe.name.startswith("durable-spaces"):
        need("probe-harnesses")
    argv = [
        fill(a, _values(recipe, tmp_path, "http://127.0.0.1:9/v1"))
        for a in recipe.data.get("available", [])
    ]
    if not argv:
        return
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, check=False)
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        pytest.skip(f"{recipe.name} is not installed here: {why[0]} (images/probe/ci-setup.sh)")


def _values(recipe: Recipe, tmp_path: Path, model_url: str) -> dict[str, str]:
    return {
        "model_url": model_url,
        "workdir": str(tmp_path / "work"),
        "state_dir": str(tmp_path / "state"),
        "run_id": tmp_path.name[-40:],
        "prompt": PROMPT,
        "recipe_dir": str(recipe.directory),
        "python": sys.executable,
    }


def scripted(tool: str, argument: str, commands: list[str]) -> Any:
    """The reply to a request: the next step's shell call, or the final answer."""
    return scripted_calls([(tool, {argument: c}) for c in commands])


def scripted_calls(calls: list[tuple[str, dict[str, str]]]) -> Any:
    """The reply to a request: the next of ``calls``, or the final answer."""

    def reply(body: dict[str, Any]) -> dict[str, Any]:
        done = sum(1 for m in body.get("messages", []) if m.get("role") == "tool")
        if done >= len(calls):
            return text_reply(FINAL)
        name, args = calls[done]
        return tool_call_reply(name, args, call_id=f"call_s{done + 1}")

    return reply


@dataclass
class Trial:
    recipe: Recipe
    tmp_path: Path
    commands: list[str]
    exits: list[int | None] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)  # of the attempt's process tree
    server: FakeOpenAIServer | None = None
    cgroups: list[host_cgroup.Cgroup] = field(default_factory=list)
    step2_starts: int = 0  # how many times the slow step's command started

    @property
    def workdir(self) -> Path:
        return self.tmp_path / "work"

    def log(self) -> list[str]:
        path = self.workdir / "log.txt"
        return path.read_text().split() if path.exists() else []

    def requests(self) -> list[dict[str, Any]]:
        assert self.server is not None
        return self.server.requests

    def start(self, which: str) -> tuple[subprocess.Popen[bytes], host_cgroup.Cgroup | None]:
        assert self.server is not None
        values = _values(self.recipe, self.tmp_path, self.server.base_url)
        argv = [fill(a, values) for a in self.recipe.data[which]]
        env = {
            **os.environ,
            "OPENAI_BASE_URL": self.server.base_url,
            "OPENAI_API_KEY": "dummy",
            "DO_NOT_TRACK": "1",
            "OPENAI_AGENTS_DISABLE_TRACING": "1",
            "PI_OFFLINE": "1",
            "PI_TELEMETRY": "0",
            "PROBE_RUN_ID": values["run_id"],
        }
        env.update({k: fill(v, values) for k, v in self.recipe.data.get("env", {}).items()})
        cgroup = None
        if host_cgroup.unavailable() is None:
            cgroup = host_cgroup.Cgroup.create(f"recipe-trial-{uuid.uuid4().hex[:12]}")
            self.cgroups.append(cgroup)
            # In the cgroup before the harness starts: its first child is born inside.
            argv = [
                "sh",
                "-c",
                'echo $$ > "$0" && exec "$@"',
                str(cgroup.path / "cgroup.procs"),
                *argv,
            ]
        n = len(self.exits)
        out = (self.tmp_path / f"attempt-{n}.out").open("wb")
        proc = subprocess.Popen(
            argv,
            cwd=self.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        return proc, cgroup

    def finish(self, proc: subprocess.Popen[bytes], began: float) -> int | None:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        code = proc.wait()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.seconds.append(time.monotonic() - began)
        self.cpu_seconds.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        self.exits.append(code)
        self.outputs.append(
            (self.tmp_path / f"attempt-{len(self.exits) - 1}.out").read_text(errors="replace")
        )
        return code

    def run(self, which: str) -> int | None:
        began = time.monotonic()
        proc, _ = self.start(which)
        return self.finish(proc, began)

    def run_killed(self, which: str, when: Path, fault: str = "process") -> None:
        """Run ``which`` until the file ``when`` holds a whole line (the step's command
        started and marked it), then kill it as ``fault`` says. Not on its appearance:
        ``echo x >> mark`` creates the file before it writes, and a kill between the two
        left the launch's start uncounted (step 2 seen to start once, not twice)."""
        began = time.monotonic()
        proc, cgroup = self.start(which)
        while not (when.exists() and when.read_text().endswith("\n")):
            assert proc.poll() is None, f"{which} ended before the kill:\n{self.tail(proc)}"
            time.sleep(0.01)
        if fault == "machine":
            assert cgroup is not None
            assert cgroup.kill()
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.finish(proc, began)

    def wait_for_commands_with(self, text: str) -> None:
        """Until no process this trial started has ``text`` in its command line (a
        command a killed attempt left running ends on its own)."""
        while any(text in _cmdline(pid) for c in self.cgroups for pid in c.pids()):
            time.sleep(0.02)

    def tail(self, proc: subprocess.Popen[bytes]) -> str:
        proc.wait()
        return (self.tmp_path / f"attempt-{len(self.exits)}.out").read_text(errors="replace")[
            -3000:
        ]

    def close(self) -> None:
        for cgroup in self.cgroups:
            with contextlib.suppress(OSError):
                cgroup.remove()
        if self.server is not None:
            self.server.stop()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


@contextlib.contextmanager
def trial(recipe: Recipe, tmp_path: Path, commands: list[str], replies: Any = None) -> Any:
    (tmp_path / "work").mkdir()
    (tmp_path / "state").mkdir()
    t = Trial(recipe, tmp_path, commands)
    t.server = FakeOpenAIServer(replies or scripted(*recipe.tool, commands)).start()
    try:
        yield t
    finally:
        t.close()


def plain_steps() -> list[str]:
    return [f"echo s{k} >> log.txt" for k in (1, 2, 3)]


def slow_step_two(marks: Path) -> list[str]:
    """Step 2 marks its start outside the workspace (one line per start), then holds
    until ``release_step_two`` (at most a minute), then makes its effect. A hold for a
    fixed time let a starved test kill it after its effect once (on a loaded machine)."""
    started, go = marks / "started-s2", marks / "go"
    return [
        "echo s1 >> log.txt",
        f"echo x >> {started}; i=0; while [ ! -e {go} ] && [ $i -lt 1200 ]; do sleep 0.05;"
        " i=$((i+1)); done; echo s2 >> log.txt",
        "echo s3 >> log.txt",
    ]


def release_step_two(marks: Path) -> None:
    """Let step 2's command go on (after the kill: an orphaned one makes its effect, a
    new one does not wait)."""
    (marks / "go").touch()


def check_uninterrupted(recipe_name: str, tmp_path: Path) -> Trial:
    """Launch once: exit 0, the three effects once each, the final answer asked for."""
    recipe = load(recipe_name)
    skip_unless_available(recipe, tmp_path)
    with trial(recipe, tmp_path, plain_steps()) as t:
        code = t.run("launch")
        assert code == 0, t.outputs[-1][-3000:]
        assert t.log() == ["s1", "s2", "s3"], t.outputs[-1][-3000:]
        assert len(t.requests()) == 4
        print(
            f"{recipe_name}: uninterrupted run {t.seconds[0]:.2f} s wall, "
            f"{t.cpu_seconds[0]:.2f} s CPU"
        )
        return t


def check_killed_mid_step(recipe_name: str, tmp_path: Path, fault: str = "process") -> Trial:
    """Launch, kill while step 2's command runs, resume until an attempt exits 0 (a few
    at most): the task ends done, step 3's effect made; what became of step 2 is printed
    (the harness's business: docs/probe-recipes.md)."""
    recipe = load(recipe_name)
    skip_unless_available(recipe, tmp_path)
    if fault == "machine":
        need("cgroup")
    marks = tmp_path / "marks"
    marks.mkdir()
    with trial(recipe, tmp_path, slow_step_two(marks)) as t:
        t.run_killed("launch", marks / "started-s2", fault)
        release_step_two(marks)
        for _ in range(3):
            if t.run("resume") == 0:
                break
        assert t.exits[-1] == 0, t.outputs[-1][-3000:]
        assert "s3" in t.log(), (t.log(), t.outputs[-1][-3000:])
        t.wait_for_commands_with(str(marks))  # an orphaned step 2 may still be running
        started = t.step2_starts = len((marks / "started-s2").read_text().split())
        shown = [
            m.get("content")
            for r in t.requests()[-1:]
            for m in r["messages"]
            if m.get("role") == "tool"
        ]
        print(
            f"{recipe_name} {fault} kill mid-step 2: exits={t.exits} log={t.log()} "
            f"step2_started={started} requests={len(t.requests())} tool_results_shown={shown}"
        )
        return t


def assert_once_or_reported(t: Trial) -> None:
    """The control's promise: every effect at most once, and a step without its effect
    was reported to the model as interrupted (or failed)."""
    log = t.log()
    assert log.count("s1") == 1 and log.count("s3") == 1, log
    assert log.count("s2") <= 1, log
    if "s2" not in log:
        shown = [m["content"] for m in t.requests()[-1]["messages"] if m["role"] == "tool"]
        assert "interrupted" in shown[1] or "error" in shown[1], shown


def check_file_tools(recipe_name: str, tmp_path: Path) -> Trial:
    """The recipe's declared write and edit tools, called with the argument names it
    declares: a whole write of ``notes.txt``, then a one-line edit of it."""
    recipe = load(recipe_name)
    skip_unless_available(recipe, tmp_path)
    w, e = recipe.data["write_tool"], recipe.data["edit_tool"]
    calls = [
        (w["name"], {w["path"]: "notes.txt", w["content"]: "W one\nslot x\n"}),
        (e["name"], {e["path"]: "notes.txt", e["old"]: "slot x", e["new"]: "E two"}),
    ]
    with trial(recipe, tmp_path, [], scripted_calls(calls)) as t:
        assert t.run("launch") == 0, t.outputs[-1][-3000:]
        assert (t.workdir / "notes.txt").read_text() == "W one\nE two\n", t.outputs[-1][-3000:]
        return t
