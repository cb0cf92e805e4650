import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from durable_spaces.backends import open_backend

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
async def _spacesd_spaces_deleted(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """After each test, the cua-spacesd Spaces it left in ``tmp_path/spaces`` are deleted:
    their daemons (and the ``unshare`` that holds each one's namespace) would run for good
    (a test's backend ``close`` leaves its Spaces, as a driver's does)."""
    yield
    tmp = request.node.funcargs.get("tmp_path")
    spaces = None if tmp is None else Path(tmp) / "spaces"
    if spaces is None or not any(spaces.glob("*/state.json")):
        return
    backend = open_backend("spacesd", spaces)
    for name in await backend.names():
        await backend.delete(name)
    await backend.close()
