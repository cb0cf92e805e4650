"""The ``durable-spaces`` and ``durable-spaces-checkpoint`` recipes' program: this
project's own harness and adapter (the probe's control), wired as
``durable_spaces/campaigns/agent.py`` wires them, with an OpenAI-compatible model
(``harness/models.py``'s ``OpenAIModel``) instead of the scripted one.

Each launch or resume is one drive attempt of ``drive/entry.py``'s
``run_durable_session``: this program plays the coordinator's part first, giving the
attempt the next epoch (a counter in ``<state>/epoch``, replaced atomically) and the
session's environment (``CUA_SESSION_*``). The Space is a ``local`` one,
``<state>/spaces/ws``, whose workspace is the working directory the probe gave (its
``work`` is a symlink to it), so the harness's tools (``bash``, ``write``, ``edit``, with
the adapter's wrapping) act on the probe's workdir. The log is
``<state>/session/log.sqlite``; checkpoints (checkpoint mode, and auto's checkpoint
calls) go to ``<state>/checkpoints``. The same program resumes: the next epoch fences the
previous attempt's, and the harness and the adapter recover the interrupted call from
the log (a command whose supervisor outlived the kill is reattached by its key).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from durable_spaces.adapter.checkpoints.snapshots import (
    DirectoryCheckpointStore,
    WorkspaceSnapshots,
)
from durable_spaces.adapter.durable import durable_spaces
from durable_spaces.backends.local.backend import LocalBackend
from durable_spaces.backends.local.disk import write_atomic
from durable_spaces.campaigns.fast_exit import exit_now
from durable_spaces.campaigns.spec import LabSettings
from durable_spaces.drive.entry import SessionHandle, StartContext, run_durable_session
from durable_spaces.harness.models import OpenAIModel
from durable_spaces.harness.scheduler import AgentConfig, Harness
from durable_spaces.harness.tools import CodingTools, Registry

SPACE = "ws"
SESSION = "probe"


def next_epoch(state: Path) -> int:
    """One more than the last attempt's, recorded before this attempt does anything."""
    path = state / "epoch"
    try:
        text = path.read_text().strip() or "0"
    except FileNotFoundError:
        text = "0"
    if not text.isascii() or not text.isdigit() or int(text) >= 2**63 - 1:
        raise SystemExit(f"ds_agent: {path} does not hold an epoch: {text[:40]!r}")
    last = int(text)
    write_atomic(path, str(last + 1).encode())
    return last + 1


def place_workspace(backend: LocalBackend, workdir: Path) -> None:
    """The Space ``ws``, its workspace the probe's workdir (``work`` a symlink to it)."""
    space = asyncio.run(backend.create(SPACE))
    work = Path(space.root)
    if work.is_symlink():
        if work.resolve() != workdir.resolve():
            raise SystemExit(f"ds_agent: {work} points elsewhere than {workdir}")
        return
    if work.exists():
        work.rmdir()  # the empty directory a new Space is made with
    work.symlink_to(workdir.resolve(), target_is_directory=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-url", required=True)
    ap.add_argument("--state", required=True, type=Path)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--mode", choices=("auto", "transactional", "checkpoint"), default="auto")
    ap.add_argument("--resume", action="store_true", help="one more attempt of the session")
    args = ap.parse_args()
    state: Path = args.state.resolve()
    state.mkdir(parents=True, exist_ok=True)
    epoch = next_epoch(state)
    backend = LocalBackend(state / "spaces")
    place_workspace(backend, Path.cwd())
    os.environ.update(
        CUA_SESSION_NAME=SESSION,
        CUA_SESSION_EPOCH=str(epoch),
        CUA_SESSION_STATE_DIR=str(state / "session"),
        CUA_SESSION_SPACE=SPACE,
    )
    store = DirectoryCheckpointStore(state / "checkpoints")
    durable = durable_spaces(
        backend, snapshots=WorkspaceSnapshots(backend, store=store), mode=args.mode
    )
    model = OpenAIModel("fake-model", base_url=args.model_url, api_key="dummy")

    async def start(ctx: StartContext) -> SessionHandle:
        durable = ctx.durable  # this attempt's copy: its epoch, fence and callbacks
        registry = Registry().install(CodingTools).install(durable.extension)
        harness = await Harness.open(
            ctx.log, models={"openai": model}, registry=registry, env=durable.env
        )
        root = await harness.root(AgentConfig(model="openai"))
        durable.bind(root.id, SPACE)
        harness.resume()
        submission = await root.submit(args.prompt, request_id=SESSION)

        async def ensure() -> None:
            await durable.ensure_space(harness, root.id)

        return SessionHandle(wait=submission.wait, close=harness.close, ensure_space=ensure)

    return run_durable_session(durable, start)


if __name__ == "__main__":
    sys.stdout.flush()
    lab = LabSettings.from_env()  # this process's edge (the campaign checked them first)
    exit_now(main(), lab.fast_exit)  # campaigns/fast_exit.py: no teardown to wait for
