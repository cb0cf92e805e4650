"""What a new lease's grant changes in a docker Space: its token file, and its epoch
floor taken back to the grant when a holder raised it past (docs/cluster-security.md).

The daemon keeps its floor in ``exec-epoch`` of its data dir, inside the container, and
reads it at start; so the floor is rewritten while the container is stopped, through the
engine's archive upload (which writes into a stopped container's filesystem), never by a
command in the Space (the Space's own commands must not be able to set its floor)."""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import tarfile
from pathlib import Path
from typing import Any

from durable_spaces.errors import SpaceError
from durable_spaces.host.files import fsync_dir

#: The daemon's data dir in the image (``Dockerfile``'s ``CUA_ENV_DATA_DIR``).
DATA_DIR = "/var/lib/cua-spacesd"


def write_token(home: Path) -> str:
    """A new random token in ``home/token`` (0600, durable), returned."""
    home.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    tmp = home / "token.tmp"
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, home / "token")
    fsync_dir(home)
    return token


def take_back(container: Any, epoch: int) -> Any:
    """``container`` killed, its floor set to ``epoch`` and started again (every process
    of it dies, as the advance to ``epoch`` would have killed them); returned reloaded."""
    with contextlib.suppress(Exception):  # the SDK's error when it is stopped already
        container.kill()
    container.wait(condition="not-running", timeout=30)
    set_floor(container, epoch)
    container.start()
    container.reload()
    return container


def set_floor(container: Any, epoch: int) -> None:
    """Rewrite the floor of ``container``'s daemon to ``epoch`` (the container is stopped:
    a running daemon keeps its floor in memory and would write it back)."""
    if not 0 <= epoch < 2**63:
        raise SpaceError(f"epoch {epoch} is not a floor the daemon can hold")
    data = str(epoch).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("exec-epoch")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    if not container.put_archive(DATA_DIR, buf.getvalue()):
        raise SpaceError(f"could not rewrite the epoch floor of container {container.name}")
