"""A wrapped command's ``DS_CALL_KEY`` (``adapter/effects.py``): its call's stable key,
under the session's namespace, the same when the call is recovered; and a call whose id
no environment can carry is refused before anything runs."""

from __future__ import annotations

from pathlib import Path

from tool_session import tool_session

from durable_spaces.adapter.effects import Effect
from durable_spaces.adapter.space_state import DOC
from durable_spaces.adapter.tool_args import BashArgs
from durable_spaces.harness.tool_tasks import record_result
from durable_spaces.harness.tools import ToolContext

KEY = {"command": 'printf %s "$DS_CALL_KEY"'}


async def test_a_command_gets_its_calls_key(tmp_path: Path) -> None:
    async with tool_session(tmp_path) as s:
        out = await s.call("bash", KEY)
        assert out.startswith(f"{s.conv}:c1\n")


async def test_a_callers_own_key_and_the_sessions_namespace(tmp_path: Path) -> None:
    async with tool_session(tmp_path) as s:
        t = s.registry.get("bash")
        assert t is not None
        ctx = ToolContext(
            harness=s.harness, conversation_id=s.conv, call_id="x", tool_name="bash",
            task_id="x", attempt=1, resumed=False, env=await s.harness.env(s.conv),
            call_key="thread-7:x",
        )  # fmt: skip
        res = await t.execute(KEY, ctx)
        await record_result(s.harness, ctx, res)
        assert res.content.startswith("thread-7:x\n")
        # A driver's adapter has the session's name as its namespace (drive/entry.py).
        assert Effect(BashArgs("true"), ctx, None, None, "sess").call_key == "sess/thread-7:x"


async def test_an_id_no_environment_can_carry_is_refused_before_the_call(tmp_path: Path) -> None:
    async with tool_session(tmp_path) as s:
        t = s.registry.get("bash")
        assert t is not None
        ctx = ToolContext(
            harness=s.harness, conversation_id=s.conv, call_id="a\x00b", tool_name="bash",
            task_id="x", attempt=1, resumed=False, env=await s.harness.env(s.conv),
        )  # fmt: skip
        res = await t.execute({"command": "echo ran >> ran.txt"}, ctx)
        assert res.status == "error" and "cannot be a key" in res.content
        assert not (await s.space.stat("ran.txt"))
        assert "a\x00b" not in (s.harness.conversation(s.conv).document(DOC) or {}).get("calls", {})
