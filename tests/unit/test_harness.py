"""The harness on MemoryStorage: commit rules, request ids, resume, fatal errors."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from durable_spaces.errors import HaltError, PermanentFailure, StaleEpochError
from durable_spaces.harness.env import ExecutionEnv, LocalDirEnv
from durable_spaces.harness.log import MemoryFence, MemoryStorage, Storage
from durable_spaces.harness.models import AssistantMessage, ToolCall
from durable_spaces.harness.scheduler import AgentConfig, Harness
from durable_spaces.harness.tools import CodingTools, Registry, Tool, ToolContext, ToolResult
from durable_spaces.testing import ScriptedModel, implied_workspace


class CallsModel:
    """Asks for the given tool calls (one message per batch), then answers "finished"."""

    def __init__(self, *batches: list[ToolCall]) -> None:
        self.batches = batches

    async def generate(self, messages: Any, tools: Any, system: str | None) -> AssistantMessage:
        turn = sum(1 for e in messages if e.kind == "assistant" and e.data["tool_calls"])
        if turn < len(self.batches):
            return AssistantMessage(f"turn {turn}", self.batches[turn])
        return AssistantMessage("finished")


def _env(root: Path) -> Any:
    async def factory(cid: str) -> ExecutionEnv:
        return LocalDirEnv(root)

    return factory


async def _open(storage: Storage, tmp_path: Path, model: Any, *tools: Tool) -> Harness:
    reg = Registry().install(CodingTools)
    if tools:
        reg.install(list(tools))
    return await Harness.open(storage, models={"m": model}, registry=reg, env=_env(tmp_path))


def _kinds(storage: MemoryStorage) -> list[list[str]]:
    """Per commit, the ops it holds (entry kinds and task states)."""
    out = []
    for c in storage.load():
        row = []
        for op in c.ops:
            if op["op"] == "entry":
                row.append(op["kind"])
            elif op["op"] == "task":
                row.append(f"{op.get('kind', 'task')}:{op.get('state', 'output')}")
            else:
                row.append(op["op"])
        out.append(row)
    return out


async def test_scripted_run_commits_in_pi_order(tmp_path: Path) -> None:
    st = MemoryStorage()
    h = await _open(st, tmp_path, ScriptedModel(7, 3))
    root = await h.root(AgentConfig("m", system="be brief"))
    settled = await (await root.submit("go")).wait()
    assert (settled.status, settled.answer) == ("done", "done")
    assert _kinds(st)[:6] == [
        ["conversation"],
        ["user", "generation:pending", "submission"],  # input + generation task: one commit
        ["assistant", "task:done", "tool:pending"],  # intent before execute
        ["task:running"],
        ["tool_result", "task:done", "generation:pending"],  # result, done, next turn
        ["assistant", "task:done", "tool:pending"],
    ]
    results = [e for e in root.entries() if e.kind == "tool_result"]
    assert [r.data["status"] for r in results] == ["ok"] * 3
    files = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert files == implied_workspace(root.entries())
    assert all(e.seq > 0 for e in root.entries())


async def test_reopen_rebuilds_the_same_state(tmp_path: Path) -> None:
    st = MemoryStorage()
    h = await _open(st, tmp_path, ScriptedModel(3, 2))
    root = await h.root(AgentConfig("m"))
    await (await root.submit("go", request_id="req")).wait()
    await root.commit(lambda tx: tx.put_document(root.id, "notes", {"n": 1}))
    h2 = await _open(st, tmp_path, ScriptedModel(3, 2))
    root2 = await h2.root()
    assert root2.id == root.id
    assert root2.entries() == root.entries()
    assert root2.document("notes") == {"n": 1}
    assert h2.tasks() == h.tasks()


async def test_request_id_admits_once_even_after_reopen(tmp_path: Path) -> None:
    st = MemoryStorage()
    h = await _open(st, tmp_path, ScriptedModel(1, 1))
    root = await h.root(AgentConfig("m"))
    a = await root.submit("hello", request_id="job-1")
    b = await root.submit("hello", request_id="job-1")
    assert a.id == b.id
    await a.wait()
    h2 = await _open(st, tmp_path, ScriptedModel(1, 1))
    c = await (await h2.root()).submit("hello", request_id="job-1")
    assert c.id == a.id and c.request_id == "job-1"
    assert (await c.wait()).status == "done"
    users = [e for e in (await h2.root()).entries() if e.kind == "user"]
    assert len(users) == 1


async def test_second_submission_queues_behind_the_first(tmp_path: Path) -> None:
    st = MemoryStorage()
    h = await _open(st, tmp_path, ScriptedModel(2, 2))
    root = await h.root(AgentConfig("m"))
    a = await root.submit("first")
    b = await root.submit("second")
    assert b.status == "queued"
    assert (await a.wait()).status == "done" and (await b.wait()).status == "done"
    kinds = [e.kind for e in root.entries()]
    # The second input enters the transcript only after the first run's final answer.
    assert kinds.index("user", 1) > len(kinds) - 3


class Gate:
    """A tool that reports output, then waits until released (or forever)."""

    def __init__(self, name: str, replay: str = "unsafe") -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.contexts: list[ToolContext] = []
        self.tool = Tool(name, "test", {"type": "object"}, self.execute, replay=replay)  # type: ignore[arg-type]

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        self.contexts.append(ctx)
        ctx.output(f"attempt {ctx.attempt} started\n")
        self.started.set()
        await self.release.wait()
        return ToolResult.ok(f"finished attempt {ctx.attempt}")


async def _cut_off(tmp_path: Path, replay: str) -> tuple[MemoryStorage, Gate]:
    """Run until the gate tool is mid-execute with output committed, then stop the harness
    (what a crash leaves: the task `running`, no result)."""
    st = MemoryStorage()
    gate = Gate("gate", replay)
    h = await _open(st, tmp_path, CallsModel([ToolCall("c1", "gate", {})]), gate.tool)
    root = await h.root(AgentConfig("m"))
    await root.submit("go", request_id="r")
    await gate.started.wait()
    await asyncio.sleep(0.35)  # past the output flush interval
    await h.close()
    [task] = [t for t in h.tasks() if t["kind"] == "tool"]
    assert task["state"] == "running" and task["attempt"] == 1
    assert task["output"] == "attempt 1 started\n"
    return st, gate


async def test_unsafe_tool_cut_off_ends_interrupted_with_committed_output(tmp_path: Path) -> None:
    st, _ = await _cut_off(tmp_path, "unsafe")
    gate2 = Gate("gate")
    h = await _open(st, tmp_path, CallsModel([ToolCall("c1", "gate", {})]), gate2.tool)
    h.resume()
    sub = await (await h.root()).submit("go", request_id="r")
    assert (await sub.wait()).answer == "finished"
    assert not gate2.contexts  # never executed again
    [result] = [e for e in (await h.root()).entries() if e.kind == "tool_result"]
    assert result.data["status"] == "interrupted"
    assert result.data["output"] == "attempt 1 started\n"
    assert "interrupted" in result.data["content"]


async def test_safe_tool_cut_off_runs_again(tmp_path: Path) -> None:
    st, _ = await _cut_off(tmp_path, "safe")
    gate2 = Gate("gate", "safe")
    gate2.release.set()
    h = await _open(st, tmp_path, CallsModel([ToolCall("c1", "gate", {})]), gate2.tool)
    h.resume()
    await h.settled()
    [ctx] = gate2.contexts
    assert (ctx.attempt, ctx.resumed, ctx.committed_output) == (2, True, "attempt 1 started\n")
    [result] = [e for e in (await h.root()).entries() if e.kind == "tool_result"]
    assert (result.data["status"], result.data["content"]) == ("ok", "finished attempt 2")


def _prefix(st: MemoryStorage, n: int) -> MemoryStorage:
    """The log as a crash right after commit ``n`` would leave it (forced state)."""
    cut = MemoryStorage()
    for c in st.load()[:n]:
        cut.append(c.ops)
    return cut


async def test_resume_from_every_prefix_of_a_run(tmp_path: Path) -> None:
    """Cut a finished run's log after each commit, reopen, resume: the run always finishes,
    the input is admitted once, every call gets one result, and a call ends interrupted
    exactly when the cut left it running."""
    full = MemoryStorage()
    h = await _open(full, tmp_path / "full", ScriptedModel(5, 4))
    (tmp_path / "full").mkdir()
    await (await (await h.root(AgentConfig("m"))).submit("go", request_id="r")).wait()
    total = len(full.load())
    for n in range(2, total + 1):
        st = _prefix(full, n)
        ws = tmp_path / f"cut{n}"
        ws.mkdir()
        h1 = await _open(st, ws, ScriptedModel(5, 4))
        running = {t["call_id"] for t in h1.tasks() if t["state"] == "running"}
        h1.resume()
        sub = await (await h1.root()).submit("go", request_id="r")
        assert (await sub.wait()).answer == "done"
        entries = (await h1.root()).entries()
        assert [e.kind for e in entries].count("user") == 1
        results = [e for e in entries if e.kind == "tool_result"]
        assert len(results) == 4 and len({r.data["call_id"] for r in results}) == 4
        interrupted = {r.data["call_id"] for r in results if r.data["status"] == "interrupted"}
        assert interrupted == running
        assert all(t["state"] == "done" for t in h1.tasks())


async def test_tool_exceptions_become_error_results_but_fatal_ones_stop(tmp_path: Path) -> None:
    async def boom(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raise ValueError("bad input")

    async def halt(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raise HaltError("cannot fence the Space")

    tools = [Tool("boom", "", {}, boom), Tool("halt", "", {}, halt)]
    st = MemoryStorage()
    model = CallsModel([ToolCall("c1", "boom", {})], [ToolCall("c2", "halt", {})])
    h = await _open(st, tmp_path, model, *tools)
    root = await h.root(AgentConfig("m"))
    sub = await root.submit("go")
    with pytest.raises(HaltError):
        await sub.wait()
    results = [e for e in root.entries() if e.kind == "tool_result"]
    assert [(r.data["call_id"], r.data["status"]) for r in results] == [("c1", "error")]
    assert "bad input" in results[0].data["content"]
    # Nothing of the halted call was recorded beyond its `running` mark.
    [halted] = [t for t in h.tasks() if t.get("call_id") == "c2"]
    assert halted["state"] == "running"
    assert isinstance(h.aborted, HaltError)
    with pytest.raises(HaltError):
        await root.commit(lambda tx: tx.entry(root.id, "note", {}))


async def test_stale_log_stops_the_run(tmp_path: Path) -> None:
    fence = MemoryFence(1)
    st = MemoryStorage(fence)
    gate = Gate("gate")
    h = await _open(st, tmp_path, CallsModel([ToolCall("c1", "gate", {})]), gate.tool)
    root = await h.root(AgentConfig("m"))
    sub = await root.submit("go")
    await gate.started.wait()
    fence.writer(2).check()  # a newer driver raised the floor
    before = len(st.load())
    gate.release.set()
    with pytest.raises(StaleEpochError):
        await sub.wait()
    assert len(st.load()) == before  # the stale result was refused whole


async def test_model_failure_settles_failed(tmp_path: Path) -> None:
    class Broken:
        async def generate(self, *a: Any) -> AssistantMessage:
            raise RuntimeError("provider down")

    h = await _open(MemoryStorage(), tmp_path, Broken())
    root = await h.root(AgentConfig("m"))
    settled = await (await root.submit("go")).wait()
    assert settled.status == "failed" and "provider down" in (settled.error or "")


async def test_unknown_tool_and_turn_limit(tmp_path: Path) -> None:
    model = CallsModel(*[[ToolCall(f"c{i}", "nope", {})] for i in range(5)])
    h = await _open(MemoryStorage(), tmp_path, model)
    root = await h.root(AgentConfig("m", max_turns=3))
    settled = await (await root.submit("go")).wait()
    assert settled.status == "failed" and "3" in (settled.error or "")
    results = [e for e in root.entries() if e.kind == "tool_result"]
    assert len(results) == 3 and all(r.data["status"] == "error" for r in results)


async def test_on_result_ops_commit_with_the_result(tmp_path: Path) -> None:
    async def record(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        def build(tx: Any, entry_id: str) -> None:
            tx.put_document(ctx.conversation_id, "outcome", {"entry": entry_id}, rewindable=True)

        ctx.on_result(build)
        return ToolResult.ok("recorded")

    st = MemoryStorage()
    model = CallsModel([ToolCall("c1", "record", {})])
    h = await _open(st, tmp_path, model, Tool("record", "", {}, record))
    root = await h.root(AgentConfig("m"))
    await (await root.submit("go")).wait()
    [result] = [e for e in root.entries() if e.kind == "tool_result"]
    assert root.document("outcome") == {"entry": result.id}
    [commit] = [c for c in st.load() if any(o.get("id") == result.id for o in c.ops)]
    assert any(o["op"] == "doc" and o["name"] == "outcome" for o in commit.ops)


async def test_missing_model_is_a_permanent_failure_not_an_outcome(tmp_path: Path) -> None:
    st = MemoryStorage()
    h = await _open(st, tmp_path, ScriptedModel(1, 1))
    root = await h.root(AgentConfig("other"))
    sub = await root.submit("go")
    with pytest.raises(PermanentFailure):
        await sub.wait()
    assert sub.status == "active"  # nothing recorded: a correctly configured driver resumes
    await h.close()
    with pytest.raises(PermanentFailure):
        await sub.wait()


async def test_a_fork_as_of_a_commit_after_its_entry_and_a_new_root(tmp_path: Path) -> None:
    """``fork(at_seq=)``: the transcript up to the entry, the documents as of a later
    commit (what was committed between the entry and the next one); ``more`` adds to the
    fork's creation commit, as ``create``'s ``build`` does to a new root's."""
    h = await _open(MemoryStorage(), tmp_path, CallsModel())
    root = await h.create(AgentConfig("m"), lambda tx, cid: tx.put_document(cid, "name", "r"))
    e1 = await root.commit(lambda tx: tx.entry(root.id, "user", {"n": 1}))
    await root.commit(lambda tx: tx.put_document(root.id, "d", {"v": 1}, rewindable=True))
    between = h.last_seq
    await root.commit(lambda tx: tx.put_document(root.id, "d", {"v": 2}, rewindable=True))
    await root.commit(lambda tx: tx.entry(root.id, "user", {"n": 2}))
    fork = await root.fork(
        e1, at_seq=between, more=lambda tx, fid: tx.put_document(fid, "name", "f")
    )
    assert [e.data for e in fork.entries()] == [{"n": 1}]
    assert fork.document("d") == {"v": 1}
    assert (fork.document("name"), root.document("name")) == ("f", "r")
    assert fork.parent_id == root.id and (await h.root()).id == root.id
    with pytest.raises(ValueError, match="not in conversation"):
        await root.fork(e1, at_seq=h.last_seq + 1)


def test_a_calls_key_is_its_conversation_and_id_unless_given(tmp_path: Path) -> None:
    def ctx(**key: str) -> ToolContext:
        return ToolContext(
            harness=None, conversation_id="c1", call_id="x", tool_name="bash", task_id="t",
            attempt=1, resumed=False, env=LocalDirEnv(tmp_path), **key,
        )  # type: ignore[arg-type]  # fmt: skip

    assert ctx().call_key == "c1:x"
    assert ctx(call_key="thread:x").call_key == "thread:x"
