"""Bad tool arguments, names and outputs: a clear tool error, nothing outside touched, the
log and the workspace consistent. A real harness, the real local backend and the real
cua-spacesd, driven by a model that asks for exactly the calls each case gives."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from needs import need
from wrapped_harness import wrapped_harness

from durable_spaces.testing import run_call_list

BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("spacesd", marks=pytest.mark.spacesd, id="spacesd"),
]


@dataclass
class Ran:
    results: list[dict[str, Any]]
    files: dict[str, bytes]  # the workspace after the run (regular files)
    root: str
    mode: str | None  # the conversation's recorded mode
    log_bytes: int


def _walk(root: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            full = os.path.join(dirpath, n)
            if os.path.isfile(full) and not os.path.islink(full):
                with open(full, "rb") as f:
                    out[os.path.relpath(full, root)] = f.read()
    return out


async def _run(tmp: Path, backend: str, mode: str, calls: Sequence[tuple[str, Any]]) -> Ran:
    async with wrapped_harness(tmp, backend, mode, calls) as (h, durable):
        conv, results = await run_call_list(h)
        space = await durable.space(conv.id)
        state = conv.document("cua.space") or {}
        return Ran(results, _walk(space.root), space.root, state.get("mode"), 0)


def _skip(backend: str) -> None:
    need(backend)


def run(tmp: Path, backend: str, mode: str, calls: Sequence[tuple[str, Any]]) -> Ran:
    _skip(backend)
    ran = asyncio.run(_run(tmp, backend, mode, calls))
    ran.log_bytes = sum(p.stat().st_size for p in tmp.glob("log.sqlite*"))
    return ran


BAD_ARGS = [
    ("write", {"content": "x"}, "missing argument 'path'"),
    ("write", {"path": "a.txt"}, "missing argument 'content'"),
    ("write", {"path": 7, "content": "x"}, "'path' must be a string"),
    ("write", {"path": "a.txt", "content": None}, "'content' must be a string"),
    ("write", {"path": "a.txt", "content": ["x"]}, "'content' must be a string"),
    ("write", {"path": "a.txt", "content": b"x".decode() + "\ud800"}, "not valid text"),
    ("write", {"path": "", "content": "x"}, "'path' must not be empty"),
    ("write", {"path": "a\x00b", "content": "x"}, "NUL"),
    ("write", {"path": "n" * 300, "content": "x"}, "over 255"),
    ("write", {"path": "d/" * 2100 + "f", "content": "x"}, "over 4096"),
    ("write", ["a.txt", "x"], "must be an object"),
    ("write", None, "must be an object"),
    ("edit", {"path": "a.txt", "old_text": "", "new_text": "y"}, "'old_text' must not be empty"),
    ("edit", {"path": "a.txt", "old_text": "x"}, "missing argument 'new_text'"),
    ("edit", {"path": "a.txt", "old_text": 1, "new_text": "y"}, "'old_text' must be a string"),
    ("bash", {}, "missing argument 'command'"),
    ("bash", {"command": None}, "'command' must be a string"),
    ("bash", {"command": ""}, "'command' must not be empty"),
    ("bash", {"command": 42}, "'command' must be a string"),
    ("bash", {"command": "echo a\x00b"}, "NUL"),
    ("bash", {"command": "true", "timeout": "5"}, "'timeout' must be a number"),
    ("bash", {"command": "true", "timeout": True}, "'timeout' must be a number"),
    ("bash", {"command": "true", "timeout": float("inf")}, "'timeout' must be a number"),
    ("bash", {"command": "true", "timeout": float("nan")}, "'timeout' must be a number"),
    ("bash", {"command": "true", "timeout": 0}, "'timeout' must be a number"),
    ("bash", {"command": "true", "timeout": -3}, "'timeout' must be a number"),
    ("bash", {"command": "true", "timeout": 1e9}, "'timeout' must be a number"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["transactional", "checkpoint"])
def test_bad_arguments_are_tool_errors_and_nothing_runs(
    tmp_path: Path, backend: str, mode: str
) -> None:
    sentinel = tmp_path / "outside.txt"
    sentinel.write_text("untouched")
    calls = [(t, a) for t, a, _ in BAD_ARGS] + [("write", {"path": "ok.txt", "content": "ok"})]
    ran = run(tmp_path, backend, mode, calls)
    assert len(ran.results) == len(calls)
    for (tool, _args, want), got in zip(BAD_ARGS, ran.results, strict=False):
        assert got["status"] == "error", (tool, got)
        assert want in got["content"], (want, got["content"])
    assert ran.results[-1]["status"] == "ok"
    assert ran.files == {"ok.txt": b"ok"}, "a refused call changed the workspace"
    assert sentinel.read_text() == "untouched"


PRINTF = "printf '\\377\\376 caf\\303\\251 \\200 old \\000 tail\\351\\n' > b.bin"


@pytest.mark.parametrize("backend", BACKENDS)
def test_edit_keeps_every_byte_it_does_not_replace(tmp_path: Path, backend: str) -> None:
    raw = b"\xff\xfe caf\xc3\xa9 \x80 old \x00 tail\xe9\n"
    calls = [
        ("write", {"path": "seed.txt", "content": "placeholder"}),
        ("bash", {"command": PRINTF}),
        ("edit", {"path": "b.bin", "old_text": "old", "new_text": "NEW"}),
    ]
    ran = run(tmp_path, backend, "transactional", calls)
    assert [r["status"] for r in ran.results] == ["ok", "ok", "ok"], ran.results
    assert ran.files["b.bin"] == raw.replace(b"old", b"NEW")


@pytest.mark.parametrize("backend", BACKENDS)
def test_bash_timeout_is_honoured(tmp_path: Path, backend: str) -> None:
    # A command that would outlive any test: only its 1 s timeout ends it (the event: the
    # result says so, and the call returned at all).
    ran = run(
        tmp_path,
        backend,
        "transactional",
        [("bash", {"command": "sleep 3600; echo late > late.txt", "timeout": 1})],
    )
    (r,) = ran.results
    assert r["status"] == "error" and "timed out after 1 s" in r["content"], r
    assert "late.txt" not in ran.files


@pytest.mark.parametrize("backend", BACKENDS)
def test_huge_output_is_bounded_in_the_result_and_the_log(tmp_path: Path, backend: str) -> None:
    ran = run(
        tmp_path,
        backend,
        "transactional",
        [("bash", {"command": "head -c 8000000 /dev/zero | tr '\\0' x; echo; echo END"})],
    )
    (r,) = ran.results
    assert r["status"] == "ok"
    assert len(r["content"]) < 1_200_000, len(r["content"])
    assert "bytes of output omitted" in r["content"] and "END" in r["content"]
    assert r["details"]["output_omitted_bytes"] > 6_000_000
    assert ran.log_bytes < 8_000_000, f"the log grew by {ran.log_bytes} bytes"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_command_that_kills_its_own_group_does_not_wedge_the_session(
    tmp_path: Path, backend: str
) -> None:
    calls = [
        ("bash", {"command": "echo before; kill -9 0"}),
        ("write", {"path": "after.txt", "content": "after"}),
    ]
    ran = run(tmp_path, backend, "transactional", calls)
    first, second = ran.results
    assert first["status"] == "error" and "signal" in first["content"], first
    assert second["status"] == "ok"
    assert ran.files == {"after.txt": b"after"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_reading_a_fifo_is_an_error_not_a_hang(tmp_path: Path, backend: str) -> None:
    calls = [
        ("bash", {"command": "mkfifo pipe && echo made"}),
        ("read", {"path": "pipe"}),
        ("edit", {"path": "pipe", "old_text": "a", "new_text": "b"}),
        ("write", {"path": "done.txt", "content": "done"}),
    ]
    ran = run(tmp_path, backend, "checkpoint", calls)
    statuses = [r["status"] for r in ran.results]
    assert statuses == ["ok", "error", "error", "ok"], ran.results
    assert ran.files == {"done.txt": b"done"}


BAD_NAMES = ["new\nline.txt", "back\\slash.txt", "dir\\x/f.txt"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_name_the_image_cannot_hold_is_refused_before_it_is_written(
    tmp_path: Path, backend: str, name: str
) -> None:
    calls = [
        ("write", {"path": name, "content": "x"}),
        ("write", {"path": "ok.txt", "content": "ok"}),
    ]
    ran = run(tmp_path, backend, "transactional", calls)
    assert (
        ran.results[0]["status"] == "error"
        and "refused before the call" in ran.results[0]["content"]
    )
    assert ran.results[1]["status"] == "ok", "the session is wedged after a refused name"
    assert ran.files == {"ok.txt": b"ok"}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", BAD_NAMES)
def test_auto_mode_switches_to_checkpoints_for_such_a_name(
    tmp_path: Path, backend: str, name: str
) -> None:
    calls = [
        ("write", {"path": "first.txt", "content": "1"}),
        ("write", {"path": name, "content": "x"}),
        ("edit", {"path": "first.txt", "old_text": "1", "new_text": "2"}),
    ]
    ran = run(tmp_path, backend, "auto", calls)
    assert [r["status"] for r in ran.results] == ["ok", "ok", "ok"], ran.results
    assert ran.mode == "checkpoint"
    assert ran.files == {"first.txt": b"2", name: b"x"}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "command",
    [
        "touch \"$(printf 'made\\nby bash')\"",
        "mkdir -p 'a\\b' && touch 'a\\b/f'",
        "mkdir -p \"$(printf 'd/%.0s' $(seq 300))\" && touch \"$(printf 'd/%.0s' $(seq 300))f\"",
    ],
    ids=["newline", "backslash-dir", "300-deep"],
)
def test_a_command_that_makes_the_workspace_unrepresentable(
    tmp_path: Path, backend: str, command: str
) -> None:
    """Auto switches to checkpoints (outcome and switch in one commit) and goes on;
    explicit transactional records the call and refuses the next with a clear error,
    instead of halting or recursing on every later call."""
    calls = [("bash", {"command": command}), ("write", {"path": "next.txt", "content": "n"})]
    auto = run(tmp_path / "auto", backend, "auto", calls)
    assert [r["status"] for r in auto.results] == ["ok", "ok"], auto.results
    assert auto.mode == "checkpoint" and auto.files.get("next.txt") == b"n"
    tx = run(tmp_path / "tx", backend, "transactional", calls)
    assert tx.results[0]["status"] == "ok"
    assert tx.results[1]["status"] == "error" and "image is stale" in tx.results[1]["content"]
    assert "next.txt" not in tx.files


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["transactional", "checkpoint"])
def test_a_read_of_no_file_is_one_clear_line(tmp_path: Path, backend: str, mode: str) -> None:
    """``read`` of "" answered ``IsADirectoryError: `` (no message), of a directory
    ``[Errno 21] Is a directory: 7`` (a descriptor for a name): now one line saying what."""
    calls = [
        ("bash", {"command": "mkdir -p d && echo x > d/f"}),
        ("read", {"path": ""}),
        ("read", {"path": "d"}),
        ("read", {"path": "."}),
        ("read", {"path": "d/f"}),
    ]
    ran = run(tmp_path, backend, mode, calls)
    empty, dir_, root, ok = ran.results[1:]
    assert empty["status"] == "error" and "'path' must not be empty" in empty["content"]
    for r, name in ((dir_, "'d'"), (root, "'.'")):
        assert r["status"] == "error", r
        assert r["content"] == f"{name} is a directory, not a file", r["content"]
    assert ok["status"] == "ok" and ok["content"] == "x\n"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_write_over_max_bytes_is_refused_before_it_writes(tmp_path: Path, backend: str) -> None:
    """Explicit transactional mode: a write's size is known before its effect, so one that
    would take the workspace over ``max_bytes`` is refused as a name the image cannot hold
    is (it used to be written, answered ok, and leave the image stale, every later call
    refused); the image stays the workspace and later calls work."""
    from durable_spaces.adapter.image import ImageLimits

    calls = [
        ("write", {"path": "a.txt", "content": "a" * 600}),
        ("write", {"path": "b.txt", "content": "b" * 600}),  # 1200 > 1000
        ("edit", {"path": "a.txt", "old_text": "a" * 10, "new_text": "c" * 500}),  # 1090
        ("write", {"path": "a.txt", "content": "a" * 900}),  # replaces: 900 fits
        ("write", {"path": "c.txt", "content": "c" * 50}),
        ("bash", {"command": "cat c.txt > d.txt"}),
    ]
    _skip(backend)

    async def go() -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any], dict[str, bytes]]:
        async with wrapped_harness(
            tmp_path, backend, "transactional", calls, transactional=ImageLimits(max_bytes=1000)
        ) as (h, durable):
            conv, results = await run_call_list(h)
            space = await durable.space(conv.id)
            image = durable.image_table(h, conv.id)
            return results, conv.document("cua.space") or {}, image, _walk(space.root)

    results, state, image, files = asyncio.run(go())
    assert [r["status"] for r in results] == ["ok", "error", "error", "ok", "ok", "ok"], results
    for r in results[1:3]:
        assert (
            r["content"].startswith("refused before the call: ")
            and "over max_bytes=1000" in (r["content"])
        ), r["content"]
    assert not state.get("image_stale"), state
    assert files == {"a.txt": b"a" * 900, "c.txt": b"c" * 50, "d.txt": b"c" * 50}
    assert {p: e.size for p, e in image.items()} == {p: len(b) for p, b in files.items()}
