"""Fuzz: random tool-argument dictionaries and random file names at the wrapped tools.

Whatever a model sends, every call ends ``ok`` or ``error`` (never a halt, a crash or an
escape), the session finishes, nothing outside the workspace appears, and in
transactional mode the log's image equals the workspace afterwards. Real harness, real
local backend; bash only runs fixed commands over random (quoted) names, since the local
stand-in's commands run on this host.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shlex
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durable_spaces.adapter.durable import durable_spaces
from durable_spaces.backends.local.backend import LocalBackend
from durable_spaces.harness.log import MemoryStorage
from durable_spaces.harness.scheduler import Harness
from durable_spaces.harness.tools import CodingTools, Registry
from durable_spaces.testing import CallListModel, run_call_list

_piece = st.one_of(
    st.sampled_from(["a", "b.txt", "..", ".", "", "d", "x y", "-rf", "$(id)", "*", "~"]),
    st.text(min_size=1, max_size=12),
    st.text(alphabet="\\\n\t\r\x00/.'\"é漢\U0001f600", min_size=1, max_size=6),
    st.sampled_from(["new\nline", "back\\slash", "tab\there"]),
)
_unrepresentable = st.tuples(
    st.sampled_from(["", "d/", "d/e/"]), st.sampled_from(["new\nline", "back\\slash", "a\\b\nc"])
).map("".join)
names = st.one_of(
    st.lists(_piece, min_size=1, max_size=4).map("/".join),
    _unrepresentable,
    st.sampled_from(["/etc/passwd", "../outside.txt", "a/../../x", "//x", "/" + "a" * 300]),
)
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.binary(max_size=8).map(lambda b: b.decode("latin-1")),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _args(keys: list[str], good: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Mostly well-formed arguments with some keys dropped or replaced by junk."""
    entries = {k: st.one_of(st.just(v), junk) for k, v in good.items()}
    extra = st.dictionaries(st.text(max_size=5), junk, max_size=2)
    full = st.fixed_dictionaries({}, optional=entries).flatmap(
        lambda d: extra.map(lambda e: {**e, **d})
    )
    return st.one_of(st.just(good), full, junk)


def _call() -> st.SearchStrategy[tuple[str, Any]]:
    write = names.flatmap(
        lambda n: _args(["path", "content"], {"path": n, "content": "data\n"}).map(
            lambda a: ("write", a)
        )
    )
    edit = names.flatmap(
        lambda n: _args(
            ["path", "old_text", "new_text"], {"path": n, "old_text": "data", "new_text": "DATA"}
        ).map(lambda a: ("edit", a))
    )
    safe = names.map(
        lambda n: (
            f"printf %s x > {shlex.quote(n)} 2>/dev/null; true"
            if not n.startswith(("/", "..")) and "/.." not in n
            else "true"
        )
    )
    bash = safe.flatmap(
        lambda c: _args(["command", "timeout"], {"command": c, "timeout": 5}).map(
            lambda a: ("bash", a)
        )
    )
    return st.one_of(write, edit, bash)


async def _run(root: Path, mode: str, calls: list[tuple[str, Any]]) -> None:
    backend = LocalBackend(root / "spaces")
    durable = durable_spaces(backend, mode=mode, epoch=1, namespace="fuzz")  # type: ignore[arg-type]
    reg = Registry().install(CodingTools).install(durable.extension)
    h = await Harness.open(
        MemoryStorage(), models={"m": CallListModel(calls)}, registry=reg, env=durable.env
    )
    try:
        conv, results = await run_call_list(h, timeout=60)
        assert len(results) == len(calls)
        assert all(r["status"] in ("ok", "error") for r in results), results
        space = await durable.space(conv.id)
        table = await space.scan()
        state = conv.document("cua.space") or {}
        if state.get("image_stale"):
            # Only a command can make the workspace unrepresentable: a write or edit is
            # refused before it writes such a name.
            ran = [tool for (tool, _), r in zip(calls, results, strict=True) if r["status"] == "ok"]
            assert "bash" in ran, f"a file tool made the image stale: {state['image_stale']}"
        elif state.get("mode") == "transactional":
            image = durable.image_table(h, conv.id)
            files = {p: e for p, e in table.items() if e.kind in ("file", "symlink")}
            assert set(image) == set(files), (sorted(image), sorted(files))
            for p, e in image.items():
                if e.kind == "file":
                    with open(os.path.join(space.root, p), "rb") as f:
                        assert hashlib.sha256(f.read()).hexdigest() == e.sha256, p
    finally:
        await h.close()
        for n in await backend.names():
            await backend.delete(n)
        await backend.close()


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    calls=st.lists(_call(), min_size=1, max_size=5),
    mode=st.sampled_from(["transactional", "auto", "checkpoint"]),
)
def test_random_arguments_and_names_never_escape_or_wedge(
    calls: list[tuple[str, Any]], mode: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        outside = root / "outside"
        outside.mkdir()
        (outside / "sentinel").write_text("untouched")
        asyncio.run(_run(root, mode, calls))
        assert sorted(os.listdir(outside)) == ["sentinel"]
        assert (outside / "sentinel").read_text() == "untouched"
        top = sorted(os.listdir(root))
        assert top == ["outside", "spaces"], f"something was created beside the Space: {top}"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    paths=st.lists(names, min_size=1, max_size=4),
    mode=st.sampled_from(["transactional", "auto"]),
)
def test_random_file_names_at_write_and_edit(paths: list[str], mode: str) -> None:
    """Well-formed calls over random names: confinement and the image's names hold."""
    calls: list[tuple[str, Any]] = []
    for p in paths:
        calls.append(("write", {"path": p, "content": "data\n"}))
        calls.append(("edit", {"path": p, "old_text": "data", "new_text": "DATA"}))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "outside").mkdir()
        asyncio.run(_run(root, mode, calls))
        assert os.listdir(root / "outside") == []
        assert sorted(os.listdir(root)) == ["outside", "spaces"]
