"""The conformance suite's fixtures: every test here runs once per backend in BACKENDS.

Adding a backend is one line in BACKENDS (``name:variant`` runs a variant of one, as
``local:direct``, the local backend without its fork server). The backend must be registered in
``durable_spaces.backends.BACKENDS``, build with ``open_backend(name, state_dir)`` and
no other options, and may define ``unavailable_reason() -> str | None`` in its module:
a non-None reason (no binary, no Docker, no QEMU) skips its tests with that reason, and
a registered module that does not exist yet skips with "not written yet".
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from needs import need

from durable_spaces.backends import open_backend
from durable_spaces.space import ExecResult, Space, SpaceBackend

BACKENDS = [
    pytest.param("local", id="local"),
    # The local backend without its fork server (DS_LOCAL_FORKSERVER=0): every command's
    # supervisor started directly, the fallback when the server cannot be had.
    pytest.param("local:direct", id="local-direct"),
    pytest.param("spacesd", marks=pytest.mark.spacesd, id="spacesd"),
    # The real daemon with its Space scanned through it (DS_HOST_SCAN=0): the change
    # journal in the Space (spacesd/guest_journal.pl), as a microvm's, on this host.
    pytest.param("spacesd:daemon-scan", marks=pytest.mark.spacesd, id="spacesd-daemon-scan"),
    pytest.param("docker", marks=pytest.mark.docker, id="docker"),
    pytest.param("microvm", marks=[pytest.mark.microvm, pytest.mark.slow], id="microvm"),
]

#: The epoch the suite's commands run under (a fresh Space's floor is 0).
EPOCH = 1

Sh = Callable[..., Awaitable[ExecResult]]


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    name, _, variant = str(request.param).partition(":")
    if variant == "direct":
        monkeypatch.setenv("DS_LOCAL_FORKSERVER", "0")  # its drivers inherit it too
    if variant == "daemon-scan":
        monkeypatch.setenv("DS_HOST_SCAN", "0")
    need(name)  # skipped without it, failed on CI (tests/needs.py)
    return name


@pytest.fixture
async def backend(
    backend_name: str, state_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[SpaceBackend]:
    # The cua SDK refuses to touch the real ~/.cua from a test: give it a private home.
    monkeypatch.setenv("CUA_HOME", str(tmp_path / "cua-home"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    b = open_backend(backend_name, state_dir)
    try:
        yield b
    finally:
        for name in await b.names():
            await b.delete(name)
        await b.close()


@pytest.fixture
async def space(backend: SpaceBackend) -> Space:
    return await backend.create(f"conf-{uuid.uuid4().hex[:10]}")


@pytest.fixture
def sh(space: Space) -> Sh:
    """Run a shell script in the Space without a key (``sh(script, **exec_kwargs)``)."""

    async def run(script: str, **kw: object) -> ExecResult:
        kw.setdefault("epoch", EPOCH)
        return await space.exec(["sh", "-c", script], key=None, **kw)  # type: ignore[arg-type]

    return run


@pytest.fixture
def key() -> Callable[[str], str]:
    """Unique idempotency keys in the adapter's format ``<conversation>:<call>:<n>@<epoch>``."""
    conv = uuid.uuid4().hex[:8]
    return lambda call: f"{conv}:{call}:0@{EPOCH}"
