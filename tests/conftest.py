"""Fixtures shared by every test folder: a quiet environment, a private state dir, and a
docker Space (skipped, saying why, where Docker or the Space image is missing); the
hooks by which a test's needs become skips, or on CI failures (``tests/needs.py``); and
the session-end check that fails a run leaving any process behind (``tests/leftovers.py``)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from leftovers import Session, failing, report
from needs import MissingCapability, need

from durable_spaces.campaigns.capabilities import CAPABILITIES, required

if TYPE_CHECKING:
    from durable_spaces.backends.docker.docker_space import DockerSpace

# Before anything imports cua (at collection time too): no telemetry from any process.
os.environ["DO_NOT_TRACK"] = "1"
os.environ["CUA_TELEMETRY"] = "0"


def pytest_configure(config: pytest.Config) -> None:
    for c in CAPABILITIES.values():  # each capability is a marker of its name
        config.addinivalue_line("markers", f"{c.name}: needs {c.what} (tests/needs.py)")
    if not hasattr(config, "workerinput"):  # the run's first process: before any worker
        config.stash[_SESSION] = Session.start()


_SESSION = pytest.StashKey[Session]()


@pytest.hookimpl(trylast=True)  # after xdist's teardown of its workers
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The run fails on any process a test started and did not end (killed, named)."""
    run = session.config.stash.get(_SESSION, None)
    if run is None:
        return
    workers = []
    if session.config.pluginmanager.hasplugin("dsession"):  # our children are xdist's
        me = str(os.getpid())
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{name}/stat").read_text().rpartition(")")[2].split()[2] == me:
                        workers.append(int(name))
    left = run.leftovers(workers)
    run.end(left)
    left = failing(left)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(report(left), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked with a capability's name needs it: skipped without it (before any
    fixture is set up)."""
    for name in dict.fromkeys(m.name for m in item.iter_markers()):
        if name in CAPABILITIES:
            need(name)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """On CI every capability is required: a test skipped for lacking one fails, with the
    reason (a skip for any other reason stays a skip)."""
    outcome = yield
    rep = outcome.get_result()
    if not rep.skipped or call.excinfo is None or not required(os.environ):
        return
    exc = call.excinfo.value
    if isinstance(exc, MissingCapability) or hasattr(exc, "capability"):
        rep.outcome = "failed"
        rep.longrepr = f"CI (CI=true) requires every capability; {exc.msg}"


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """A fresh directory where a backend keeps its Spaces (unique per test, -n safe)."""
    d = tmp_path / "state"
    d.mkdir()
    return d


@pytest.fixture
async def docker_space(tmp_path: Path) -> AsyncIterator[DockerSpace]:
    """A new docker Space at epoch 1, its backend's state under ``tmp_path/state``."""
    from durable_spaces.backends.docker.backend import DockerBackend

    need("docker")
    b = DockerBackend(tmp_path / "state")
    try:
        sp = await b.create(f"t-{uuid.uuid4().hex[:10]}")
        await sp.advance_epoch(1)
        yield sp
    finally:
        await b.delete_all()
        await b.close()
