"""Nothing lost, whoever opens the Space: a new log, a second log file, a driver with a
reused session name and a fresh log, and two live logs of one session name on one
Space. Log A writes ``report.md`` and ``results.csv``; the user adds ``thesis.txt`` by
hand (it is in no log and no checkpoint). Whatever opens the Space next must not delete
any of the three: a new log gets a Space of its own (the Space names carry the log's
identity), and a log that meets another log's Space refuses, changing nothing, unless
told to take it (``adapter/space_owner.py``). These are the exact scenarios that used
to lose every file (the log witness took a brand-new log for one that lost its tail:
``log_behind {log: 0, space: 2}``, then ``reverted``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from durable_spaces.adapter.checkpoints.snapshots import (
    DirectoryCheckpointStore,
    WorkspaceSnapshots,
)
from durable_spaces.adapter.durable import DurableSpaces, durable_spaces
from durable_spaces.backends import open_backend, unavailable_reason
from durable_spaces.errors import SpaceOwnedError
from durable_spaces.harness.log import SqliteStorage
from durable_spaces.harness.models import AssistantMessage, ToolCall
from durable_spaces.harness.scheduler import AgentConfig, Harness
from durable_spaces.harness.tools import CodingTools, Registry
from durable_spaces.settings import Settings
from durable_spaces.space import SpaceBackend
from durable_spaces.testing import CallListModel

BACKENDS = ["local", pytest.param("spacesd", marks=pytest.mark.spacesd)]
#: Every backend whose Spaces the adapter keeps by workspace checkpoints.
ALL_BACKENDS = [*BACKENDS, pytest.param("docker", marks=pytest.mark.docker)]
MODES = ["transactional", "auto", "checkpoint"]
A_CALLS: list[tuple[str, Any]] = [
    ("write", {"path": "report.md", "content": "# Report\n"}),
    ("bash", {"command": "printf 'x,y\\n1,2\\n' > results.csv"}),
]
THESIS = b"years of work\n"
A_FILES = {"report.md": b"# Report\n", "results.csv": b"x,y\n1,2\n", "thesis.txt": THESIS}


class Then(CallListModel):
    """``CallListModel`` for this submission: its calls count from the last user entry,
    so a log that already holds calls goes on with these (under call ids of their own:
    the adapter knows a call by its id)."""

    async def generate(self, messages: Any, tools: Any, system: Any) -> Any:
        last = max((i for i, e in enumerate(messages) if e.kind == "user"), default=-1)
        step = sum(1 for e in messages[last + 1 :] if e.kind == "tool_result")
        if step >= len(self.calls):
            return AssistantMessage("done")
        name, args = self.calls[step]
        return AssistantMessage(f"step {step}", [ToolCall(f"call-{last}-{step}", name, args)])


class Host:
    """One spaces directory and a checkpoint store; logs come and go beside them."""

    def __init__(self, tmp: Path, backend: str, mode: str) -> None:
        self.tmp = tmp
        self.mode = mode
        self.backend: SpaceBackend = open_backend(backend, tmp / "spaces")
        self.store = DirectoryCheckpointStore(tmp / "store")
        self.settings: Settings | None = None  # the adapter's (DS_SPACE_ADOPT, ...)

    def adapter(self, epoch: int = 1, namespace: str | None = None) -> DurableSpaces:
        snaps = WorkspaceSnapshots(self.backend, store=self.store)
        return durable_spaces(
            self.backend,
            snapshots=snaps,
            mode=self.mode,  # type: ignore[arg-type]
            epoch=epoch,
            namespace=namespace,
            settings=self.settings,
        )

    async def run(
        self,
        log: str,
        calls: list[tuple[str, Any]],
        *,
        epoch: int = 1,
        namespace: str | None = None,
    ) -> tuple[DurableSpaces, list[dict[str, Any]]]:
        """Run ``calls`` on the log file ``log`` (created if missing) to the end."""
        durable = self.adapter(epoch, namespace)
        reg = Registry().install(CodingTools).install(durable.extension)
        storage = SqliteStorage(self.tmp / log)
        h = await Harness.open(storage, models={"m": Then(calls)}, registry=reg, env=durable.env)
        try:
            root = await h.root(AgentConfig(model="m"))
            had = sum(1 for e in root.entries() if e.kind == "tool_result")
            done = await (await root.submit("go", request_id=f"go-{len(root.entries())}")).wait()
            assert done.status == "done", done
            results = [e.data for e in root.entries() if e.kind == "tool_result"][had:]
        finally:
            await h.close()
            await durable.close()
            storage.close()
        return durable, results

    async def workspaces(self) -> dict[str, dict[str, bytes]]:
        """Every Space's workspace files, read through the Space."""
        out = {}
        for name in await self.backend.names():
            space = await self.backend.find(name)
            assert space is not None
            table = await space.scan(".")
            out[name] = {p: await space.read_file(p) for p, e in table.items() if e.kind == "file"}
        return out

    async def add_by_hand(self, path: str, data: bytes) -> None:
        """The user adds a file to the one Space's workspace, outside every call."""
        (name,) = await self.backend.names()
        space = await self.backend.find(name)
        assert space is not None
        await space.write_file(path, data, epoch=await space.current_epoch())

    async def close(self) -> None:
        for name in await self.backend.names():
            await self.backend.delete(name)
        await self.backend.close()


def _holds(workspaces: dict[str, dict[str, bytes]], files: dict[str, bytes]) -> bool:
    return any(all(ws.get(p) == b for p, b in files.items()) for ws in workspaces.values())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["log deleted", "second log file"])
async def test_a_new_log_in_the_same_spaces_directory_deletes_nothing(
    tmp_path: Path, backend: str, mode: str, how: str
) -> None:
    await _a_new_log_deletes_nothing(tmp_path, backend, mode, how)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
async def test_on_every_backend_another_logs_space_is_refused_and_a_new_log_has_its_own(
    tmp_path: Path, backend: str
) -> None:
    await _a_new_log_deletes_nothing(tmp_path, backend, "transactional", "second log file")
    if why := unavailable_reason(backend):
        pytest.skip(f"backend {backend} unavailable: {why}")
    (tmp_path / "ns").mkdir()
    host = Host(tmp_path / "ns", backend, "checkpoint")
    try:
        await host.run("y.sqlite", Y_CALLS, namespace="s")
        seen = await host.workspaces()
        with pytest.raises(SpaceOwnedError, match="another log"):
            await host.run("x.sqlite", X_CALLS, namespace="s")
        assert await host.workspaces() == seen
    finally:
        await host.close()


async def _a_new_log_deletes_nothing(tmp_path: Path, backend: str, mode: str, how: str) -> None:
    if why := unavailable_reason(backend):
        pytest.skip(f"backend {backend} unavailable: {why}")
    host = Host(tmp_path, backend, mode)
    try:
        await host.run("a.sqlite", A_CALLS)
        await host.add_by_hand("thesis.txt", THESIS)
        if how == "log deleted":
            for f in tmp_path.glob("a.sqlite*"):
                f.unlink()
            second = "a.sqlite"  # a new log at the same path
        else:
            second = "b.sqlite"
        new = [("write", {"path": "new.txt", "content": "new conversation\n"})]
        durable, results = await host.run(second, new)
        assert [r["status"] for r in results] == ["ok"]
        kinds = [e.kind for e in durable.events]
        assert "log_behind" not in kinds and "reverted" not in kinds, kinds
        spaces = await host.workspaces()
        assert _holds(spaces, A_FILES), f"A's files and thesis.txt are gone: {spaces}"
        assert _holds(spaces, {"new.txt": b"new conversation\n"})
    finally:
        await host.close()


class Turns:
    """A model that asks for ``calls`` one step at a time, each only once the test lets
    it (``go``): two live sessions take turns exactly as the test says."""

    def __init__(self, calls: list[tuple[str, Any]]) -> None:
        self.model = CallListModel(calls)
        self.gates = [asyncio.Event() for _ in range(len(calls) + 1)]
        self.told: list[str] = []  # every tool result the model was given

    async def generate(self, messages: Any, tools: Any, system: Any) -> Any:
        results = [e for e in messages if e.kind == "tool_result"]
        self.told = [str(e.data.get("content")) for e in results]
        await self.gates[len(results)].wait()
        return await self.model.generate(messages, tools, system)


class Live:
    """One session's log, open and driven turn by turn."""

    def __init__(self, host: Host, log: str, calls: list[tuple[str, Any]], **adapter: Any):
        self.host, self.log, self.turns, self.adapter = host, log, Turns(calls), adapter
        self.turn = 0

    async def open(self) -> Live:
        self.durable = self.host.adapter(**self.adapter)
        reg = Registry().install(CodingTools).install(self.durable.extension)
        self.storage = SqliteStorage(self.host.tmp / self.log)
        self.harness = await Harness.open(
            self.storage, models={"m": self.turns}, registry=reg, env=self.durable.env
        )
        root = await self.harness.root(AgentConfig(model="m"))
        self.root = root
        self.done = asyncio.ensure_future((await root.submit("go", request_id="go")).wait())
        return self

    async def step(self) -> None:
        """Let the next call run to its result (or the run end)."""
        before = sum(1 for e in self.root.entries() if e.kind == "tool_result")
        self.turns.gates[self.turn].set()
        self.turn += 1
        while sum(1 for e in self.root.entries() if e.kind == "tool_result") == before:
            if self.done.done():
                return
            await asyncio.wait({self.done}, timeout=0.05)  # until the result commits

    async def finish(self) -> Any:
        """Let every step run; the run's end."""
        for gate in self.turns.gates:
            gate.set()
        return await asyncio.wait_for(self.done, 60)

    async def close(self) -> None:
        for gate in self.turns.gates:
            gate.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.done, 60)
        await self.harness.close()
        await self.durable.close()
        self.storage.close()


Y_CALLS: list[tuple[str, Any]] = [
    ("bash", {"command": "echo Y-output > y.txt; echo Y-output"}),
    ("bash", {"command": "cat y.txt"}),
]
X_CALLS: list[tuple[str, Any]] = [("bash", {"command": "echo X-ran > proof-x.txt"})]


@pytest.mark.parametrize("mode", MODES)
async def test_two_live_logs_of_one_session_name_never_share_the_space(
    tmp_path: Path, mode: str
) -> None:
    """Two sessions of one name (one namespace), each with its own log, live at once on
    one Space, taking turns. The second must not revert the first's work, run under its
    keys nor be told its output: it is refused (the Space is the first's) and changes
    nothing, and the first goes on."""
    host = Host(tmp_path, "local", mode)
    y = await Live(host, "y.sqlite", Y_CALLS, namespace="s").open()
    x = await Live(host, "x.sqlite", X_CALLS, namespace="s").open()
    try:
        await y.step()
        seen = await host.workspaces()
        await x.step()
        with pytest.raises(SpaceOwnedError, match="another log"):  # ends the session
            await asyncio.wait_for(x.done, 60)
        assert not any("Y-output" in t for t in x.turns.told)
        assert await host.workspaces() == seen  # nothing changed: y.txt kept, no proof-x
        assert (await y.finish()).status == "done"
        assert "Y-output" in y.turns.told[-1]  # its own file, as it wrote it
    finally:
        await x.close()
        await y.close()
        await host.close()


def _driver(tmp: Path, state: str, epoch: int, **env: str) -> subprocess.CompletedProcess[str]:
    """One attempt of the lab's scripted driver for session ``crash-session``, its log in
    ``tmp/state``, to its end."""
    from tests.adapter.drive import AGENT, driver_env

    e = driver_env(tmp, epoch)
    e.update(CUA_SESSION_STATE_DIR=str(tmp / state), **env)
    return subprocess.run(AGENT, env=e, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("mode", ["transactional", "checkpoint"])
def test_a_driver_with_a_reused_session_name_and_a_fresh_log_changes_nothing(
    tmp_path: Path, mode: str
) -> None:
    from tests.adapter.drive import cleanup, setup

    setup(tmp_path, "local", mode, calls=3, sleep=0.05)
    try:
        first = _driver(tmp_path, "state", 1)
        assert first.returncode == 0, first.stderr
        host = Host(tmp_path, "local", mode)
        asyncio.run(host.add_by_hand("thesis.txt", THESIS))
        before = asyncio.run(host.workspaces())
        os.makedirs(tmp_path / "state2")
        (tmp_path / "state2" / "agent.json").write_bytes(
            (tmp_path / "state" / "agent.json").read_bytes()
        )
        second = _driver(tmp_path, "state2", 1)
        assert second.returncode == 78, second.stderr
        last = second.stderr.strip().splitlines()[-1]
        assert "another log" in last and "DS_SPACE_ADOPT" in last, second.stderr
        assert asyncio.run(host.workspaces()) == before  # nothing changed
    finally:
        asyncio.run(cleanup(tmp_path, "local"))


def _fresh_state(tmp: Path, state: str) -> None:
    os.makedirs(tmp / state)
    (tmp / state / "agent.json").write_bytes((tmp / "state" / "agent.json").read_bytes())


@pytest.mark.parametrize("mode", ["transactional", "checkpoint"])
def test_a_fresh_log_takes_another_logs_space_only_as_told_and_loses_nothing(
    tmp_path: Path, mode: str
) -> None:
    """``DS_SPACE_ADOPT=as-is``: the fresh log takes the Space with everything in it.
    ``DS_SPACE_ADOPT=log``: it takes the Space back to its own (empty) log, and what only
    the Space held is in a quarantine checkpoint, listed and restored by the CLI."""
    from tests.adapter.drive import cleanup, setup

    setup(tmp_path, "local", mode, calls=3, sleep=0.05)
    host = Host(tmp_path, "local", mode)
    try:
        assert _driver(tmp_path, "state", 1).returncode == 0
        asyncio.run(host.add_by_hand("thesis.txt", THESIS))
        (before,) = asyncio.run(host.workspaces()).values()

        _fresh_state(tmp_path, "as-is")
        took = _driver(tmp_path, "as-is", 1, DS_SPACE_ADOPT="as-is")
        assert took.returncode == 0, took.stderr
        assert '"kind": "claimed"' in took.stdout
        (after,) = asyncio.run(host.workspaces()).values()
        assert set(before) <= set(after) and after["thesis.txt"] == THESIS

        _fresh_state(tmp_path, "log")
        back = _driver(tmp_path, "log", 5, DS_SPACE_ADOPT="log")  # above as-is's floor
        assert back.returncode == 0, back.stderr
        (mine,) = asyncio.run(host.workspaces()).values()
        assert "thesis.txt" not in mine  # the Space is this log's: its own work only
        cli = ["durable-spaces", "quarantine"]
        where = ["--backend", "local", "--backend-dir", str(tmp_path / "spaces")]
        where += ["--store", str(tmp_path / "store")]
        listed = subprocess.run(
            [*cli, "list", str(tmp_path / "log"), *where], capture_output=True, text=True
        )
        assert listed.returncode == 0, listed.stderr
        (line,) = listed.stdout.splitlines()
        assert "thesis.txt" in line and " reverted " in line, line
        got = tmp_path / "got"
        restored = subprocess.run(
            [*cli, "restore", str(tmp_path / "log"), line.split()[0], "--to", str(got), *where],
            capture_output=True,
            text=True,
        )
        assert restored.returncode == 0, restored.stderr
        assert (got / "thesis.txt").read_bytes() == THESIS
        for path in after:
            assert (got / path).read_bytes() == after[path]  # all it held, as it held it
    finally:
        asyncio.run(cleanup(tmp_path, "local"))
