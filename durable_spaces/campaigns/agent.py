"""The campaign's driver program: a scripted agent session under ``run_durable_session``.

``python -m durable_spaces.campaigns.agent`` is what the coordinator launches per
attempt. Besides the driver's own environment (``CUA_SESSION_*``) it reads the run's
configuration from ``$CUA_SESSION_STATE_DIR/agent.json`` (written by the runner):
backend and its state dir, durable mode, seed, calls, the checkpoint store.
It is also the example of how a real deployment wires the parts together.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from durable_spaces.adapter.checkpoints.snapshots import (
    DirectoryCheckpointStore,
    SandboxSnapshots,
    Snapshots,
    WorkspaceSnapshots,
)
from durable_spaces.adapter.durable import DurableSpaces, durable_spaces
from durable_spaces.adapter.image import ImageLimits
from durable_spaces.backends import backend_class, open_backend
from durable_spaces.campaigns.fast_exit import exit_now
from durable_spaces.campaigns.spec import LabSettings
from durable_spaces.drive.entry import (
    SessionHandle,
    StartContext,
    bad_environment,
    read_session,
    run_durable_session,
)
from durable_spaces.errors import ConfigError
from durable_spaces.harness.models import ScriptedModel, check_gate
from durable_spaces.harness.scheduler import AgentConfig, Harness
from durable_spaces.harness.tools import CodingTools, Registry
from durable_spaces.host import holders as host_holders
from durable_spaces.host.bounded import load_object
from durable_spaces.settings import Settings

CONFIG_FILE = "agent.json"
REQUEST = "Do the scripted steps."


@dataclass
class AgentConfigFile:
    backend: str
    backend_dir: str
    mode: str  # durable mode: auto | transactional | checkpoint
    seed: str
    calls: int
    store_dir: str | None = None  # None: checkpoints only inside the Space
    snapshots: str = "workspace"  # workspace | sandbox
    sleep: float = 0.05
    max_files: int | None = None  # transactional limit (None: the default 1000)
    server: bool = False  # step 0 starts a long-lived process (the "server" mode)
    gate: str | None = None  # commands wait for this file (tests: ``ScriptedModel``'s gate)

    def save(self, state_dir: Path) -> None:
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / CONFIG_FILE).write_text(json.dumps(asdict(self), indent=1))

    @staticmethod
    def load(state_dir: Path) -> AgentConfigFile:
        path = state_dir / CONFIG_FILE
        try:
            cfg = AgentConfigFile(**load_object(path))
            if cfg.gate is not None:
                check_gate(str(cfg.gate))
            return cfg
        except FileNotFoundError:
            raise ConfigError(f"{path} is missing") from None
        except OSError as e:
            raise ConfigError(f"{path} cannot be read: {e.strerror or e}") from None
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{path} is malformed: {e}") from None


def build(cfg: AgentConfigFile) -> tuple[DurableSpaces, ScriptedModel]:
    settings = Settings.from_env()  # the driver's edge: its product settings, read once
    backend = open_backend(cfg.backend, cfg.backend_dir, settings=settings)
    snapshots: Snapshots
    if cfg.snapshots == "sandbox":
        snapshots = SandboxSnapshots(backend)
    else:
        store = (
            DirectoryCheckpointStore(cfg.store_dir, make_ahead=settings.inode_pool)
            if cfg.store_dir
            else None
        )
        snapshots = WorkspaceSnapshots(backend, store=store, settings=settings)
    limits = ImageLimits(max_files=cfg.max_files) if cfg.max_files is not None else None
    durable = durable_spaces(
        backend,
        snapshots=snapshots,
        mode=cfg.mode,  # type: ignore[arg-type]
        transactional=limits,
        settings=settings,
    )
    model = ScriptedModel(cfg.seed, cfg.calls, sleep=cfg.sleep, server=cfg.server, gate=cfg.gate)
    return durable, model


def warm_up(state_dir: Path) -> None:
    """Before a warm driver's launch (``drive/warm_driver.py``): import this run's
    backend and let it start what it can without a Space (its class's ``warm_up``), and
    find the host's kernel threads, which the first checkpoint's look at who holds the
    workspace's files would otherwise look at on the attempt's way (``host.holders``)."""
    cfg = AgentConfigFile.load(state_dir)
    warm = getattr(backend_class(cfg.backend), "warm_up", None)
    if callable(warm):
        warm(cfg.backend_dir)
    host_holders.prime()


def main() -> int:
    try:  # the environment first: agent.json is read from the state dir it names
        session = read_session()
    except ConfigError as e:
        return bad_environment(e)
    try:
        cfg = AgentConfigFile.load(session.state_dir)
        durable, model = build(cfg)
    except ConfigError as e:  # a malformed configuration: permanent
        print(f"campaign agent: {e}", file=sys.stderr)
        return 78

    async def start(ctx: StartContext) -> SessionHandle:
        durable = ctx.durable  # this attempt's copy: its epoch, fence and callbacks
        registry = Registry().install(CodingTools).install(durable.extension)
        harness = await Harness.open(
            ctx.log, models={"scripted": model}, registry=registry, env=durable.env
        )
        root = await harness.root(AgentConfig(model="scripted"))
        if ctx.session.space:
            durable.bind(root.id, ctx.session.space)  # the Space the coordinator placed
        harness.resume()
        submission = await root.submit(REQUEST, request_id=ctx.session.name)

        async def ensure() -> None:
            await durable.ensure_space(harness, root.id)

        return SessionHandle(wait=submission.wait, close=harness.close, ensure_space=ensure)

    return run_durable_session(durable, start)


if __name__ == "__main__":
    lab = LabSettings.from_env()  # this process's edge (the campaign checked them first)
    exit_now(main(), lab.fast_exit)  # campaigns/fast_exit.py: no teardown to wait for
