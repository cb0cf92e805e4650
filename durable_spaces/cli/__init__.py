"""The ``durable-spaces`` command: campaigns, repros, reports, reviews, the cluster.

One module per group of commands, each registering on the one Typer ``app``
(``durable_spaces/cli/app.py``, which also turns every error into one line):
``campaigns.py`` (campaign, repro, agent), ``inspect.py`` (report, check, diff),
``cluster.py`` (host, coordinator, submit, worker), ``tls.py`` (tls init, enroll, renew,
approve, revoke, list), ``probe.py`` (probe), ``quarantine.py`` (quarantine list,
quarantine restore). Importing this package registers them.
"""

from __future__ import annotations

from durable_spaces.cli import campaigns, cluster, inspect, probe, quarantine, tls
from durable_spaces.cli.app import app

__all__ = ["app", "main"]

# registered on ``app`` by being imported
_COMMANDS = (campaigns, cluster, inspect, probe, quarantine, tls)


def main() -> None:  # pragma: no cover - console entry
    app(prog_name="durable-spaces")
