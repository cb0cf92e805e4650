"""The registry (install, wrap) and the built-in tools through a LocalDirEnv."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from durable_spaces.errors import PathEscapeError
from durable_spaces.harness.env import LocalDirEnv
from durable_spaces.harness.tools import (
    CodingTools,
    Extension,
    Registry,
    Tool,
    ToolContext,
    ToolResult,
)


def _ctx(root: Path, name: str = "t") -> ToolContext:
    return ToolContext(
        harness=None,  # type: ignore[arg-type]  # builtins never touch the harness
        conversation_id="c1",
        call_id="call",
        tool_name=name,
        task_id="t1",
        attempt=1,
        resumed=False,
        env=LocalDirEnv(root),
    )


async def _run(root: Path, name: str, **args: Any) -> tuple[ToolResult, ToolContext]:
    tool = Registry().install(CodingTools).get(name)
    assert tool is not None
    ctx = _ctx(root, name)
    return await tool.execute(args, ctx), ctx


def test_wrap_replaces_an_installed_tool_in_place() -> None:
    seen: list[str] = []

    def wrap(inner: Tool) -> Tool:
        async def execute(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
            seen.append(f"before {inner.name}")
            return await inner.execute(args, ctx)

        return inner.with_execute(execute)

    reg = Registry().install(CodingTools)
    reg.install(Extension("durable", wrap={"bash": wrap, "write": wrap}))
    assert [t.name for t in reg.tools()] == ["read", "write", "edit", "bash"]
    bash = reg.get("bash")
    assert bash is not None and bash.replay == "unsafe"
    assert reg.get("read") is CodingTools.tools[0]
    with pytest.raises(KeyError):
        Registry().install(Extension("x", wrap={"bash": wrap}))  # nothing to wrap yet


async def test_builtin_read_write_edit(tmp_path: Path) -> None:
    res, _ = await _run(tmp_path, "write", path="sub/dir/a.txt", content="one\ntwo\nthree\n")
    assert res.status == "ok" and (tmp_path / "sub/dir/a.txt").read_text() == "one\ntwo\nthree\n"
    res, _ = await _run(tmp_path, "read", path="sub/dir/a.txt", offset=2, limit=1)
    assert (res.status, res.content) == ("ok", "two\n")
    res, _ = await _run(tmp_path, "edit", path="sub/dir/a.txt", old_text="two", new_text="2")
    assert res.status == "ok" and (tmp_path / "sub/dir/a.txt").read_text() == "one\n2\nthree\n"
    (tmp_path / "dup.txt").write_text("x\nx\n")
    res, _ = await _run(tmp_path, "edit", path="dup.txt", old_text="x", new_text="y")
    assert res.status == "error" and "2 times" in res.content
    res, _ = await _run(tmp_path, "edit", path="dup.txt", old_text="zz", new_text="y")
    assert res.status == "error" and "not found" in res.content
    res, _ = await _run(tmp_path, "read", path="nope.txt")
    assert res.status == "error"
    assert (tmp_path / "dup.txt").read_text() == "x\nx\n"


async def test_builtin_bash_streams_output_and_reports_exit_code(tmp_path: Path) -> None:
    res, ctx = await _run(tmp_path, "bash", command="echo hi; echo err >&2; pwd")
    assert res.status == "ok" and res.details["exit_code"] == 0
    assert res.content == f"hi\nerr\n{os.path.realpath(tmp_path)}\n\n[exit code: 0]"
    assert ctx.output_so_far == f"hi\nerr\n{os.path.realpath(tmp_path)}\n"
    res, _ = await _run(tmp_path, "bash", command="exit 3")
    assert res.status == "error" and res.content.endswith("[exit code: 3]")
    res, _ = await _run(tmp_path, "bash", command="echo started; sleep 5", timeout=0.3)
    assert res.status == "error" and "timed out" in res.content and "started" in res.content


async def test_env_confines_paths(tmp_path: Path) -> None:
    env = LocalDirEnv(tmp_path / "ws")
    os.makedirs(env.cwd)
    os.symlink("/etc", tmp_path / "ws" / "link")
    for bad in ["../x", "/etc/passwd", "link/passwd"]:
        with pytest.raises(PathEscapeError):
            await env.read_file(bad)
    with pytest.raises(PathEscapeError):
        await env.write_file("../escape.txt", b"x")
    await env.write_file(os.path.join(env.cwd, "ok.txt"), b"fine")
    assert await env.exists("ok.txt") and await env.read_file("ok.txt") == b"fine"
