"""What transactional mode reads back from the Space to record a call's diff: the bytes a
``write``/``edit`` wrote are never read again (the tool holds them), and the files a
command changed come in one ``read_files`` transfer, not one read per file. The image it
records must still hold exactly the workspace's bytes.

A real harness and the real local and spacesd backends; the Space class's reads are
counted where they happen (the methods themselves run unchanged).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from needs import need
from wrapped_harness import wrapped_harness

from durable_spaces.adapter import image_log
from durable_spaces.backends.local.local_space import LocalSpace
from durable_spaces.testing import run_call_list

BACKENDS = [
    pytest.param("local", id="local"),
    pytest.param("spacesd", marks=pytest.mark.spacesd, id="spacesd"),
]

CHANGE_TEN = "for i in 0 1 2 3 4 5 6 7 8 9; do printf 'cmd %s\\n' $i > c$i.txt; done"


def _space_class(backend: str) -> type:
    if backend == "local":
        return LocalSpace
    from durable_spaces.backends.spacesd.backend import NamespacedSpace

    return NamespacedSpace


def _count_reads(monkeypatch: pytest.MonkeyPatch, cls: type) -> list[tuple[str, list[str]]]:
    """Every ``read_file``/``read_files`` the adapter asks of a Space of ``cls``, in order
    (after the call pipeline's own tools: what the edit tool reads is the tool's)."""
    seen: list[tuple[str, list[str]]] = []
    one, many = cls.read_file, cls.read_files

    async def read_file(self: Any, path: str) -> bytes:
        seen.append(("read_file", [path]))
        return await one(self, path)

    async def read_files(self: Any, paths: Sequence[str]) -> dict[str, bytes]:
        seen.append(("read_files", sorted(paths)))
        return await many(self, paths)

    monkeypatch.setattr(cls, "read_file", read_file)
    monkeypatch.setattr(cls, "read_files", read_files)
    return seen


def _walk(root: str) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for dirpath, _dirs, names in os.walk(root):
        for n in names:
            full = os.path.join(dirpath, n)
            with open(full, "rb") as f:
                out[os.path.relpath(full, root)] = f.read()
    return out


async def _run(tmp: Path, backend: str, calls: list[tuple[str, Any]]) -> None:
    """Runs ``calls`` (transactional); checks the recorded image against the workspace."""
    async with wrapped_harness(tmp, backend, "transactional", calls) as (h, durable):
        conv, results = await run_call_list(h)
        assert [r["status"] for r in results] == ["ok"] * len(calls), results
        space = await durable.space(conv.id)
        files = _walk(space.root)
        table = image_log.table(h, conv.id)
        assert set(table) == set(files)
        for path, entry in table.items():
            assert image_log.blob(h, conv.id, entry.sha256 or "") == files[path], path


@pytest.mark.parametrize("backend", BACKENDS)
def test_what_the_tool_wrote_is_not_read_back_and_a_command_s_files_come_in_one_go(
    tmp_path: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    need(backend)
    seen = _count_reads(monkeypatch, _space_class(backend))
    calls: list[tuple[str, Any]] = [
        ("write", {"path": "w/a.txt", "content": "written by the tool\n"}),
        ("write", {"path": "w/b.txt", "content": "another\n"}),
        ("edit", {"path": "w/a.txt", "old_text": "the tool", "new_text": "an edit"}),
        ("bash", {"command": CHANGE_TEN}),
    ]
    asyncio.run(_run(tmp_path, backend, calls))
    # The edit tool reads the file it edits (that is the tool); nothing else reads what a
    # write or edit wrote.
    assert ("read_file", ["w/a.txt"]) in seen
    written = {"w/a.txt", "w/b.txt"}
    others = [s for s in seen if s != ("read_file", ["w/a.txt"])]
    assert not [s for s in others if written & set(s[1])], seen
    # The command's ten new files: one transfer, never one by one.
    changed = {f"c{i}.txt" for i in range(10)}
    batches = [s for s in others if changed & set(s[1])]
    assert batches == [("read_files", sorted(changed))], seen


@pytest.mark.spacesd
def test_a_call_whose_command_kills_the_journal_still_records_its_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command of the Space's user that kills the change journal's helper in the Space
    (``spacesd/guest_journal.pl``, what a microvm's Space runs; here spacesd with the host
    scan off) after it changed files: the call's image still holds what it changed (the
    scan after a lost helper is the daemon's own), not what the journal knew before. The
    mutant ``journal_loss_trusted`` records the call as changing nothing."""
    need("spacesd")
    from durable_spaces.backends.spacesd.daemon import unshare_reason

    if (why := unshare_reason()) is not None:  # a pkill must reach this Space's only
        pytest.skip(f"no PID namespace for the Space: {why}")
    monkeypatch.setenv("DS_HOST_SCAN", "0")
    calls: list[tuple[str, Any]] = [
        ("bash", {"command": "printf before > a.txt"}),
        (
            "bash",
            {"command": "printf after >> a.txt; printf new > b.txt; pkill -KILL -x perl; true"},
        ),
    ]
    asyncio.run(_run(tmp_path, "spacesd", calls))
