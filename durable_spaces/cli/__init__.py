"""The ``durable-spaces`` command: campaigns, repros, reports, reviews, the cluster.

One module per group of commands, each registering on the one Typer ``app``
(``durable_spaces/cli/app.py``, which also turns every error into one line):
``campaigns.py`` (campaign, repro, agent), ``inspect.py`` (report, check, diff),
``cluster.py`` (host, coordinator, submit, worker), ``tls.py`` (tls init, enroll, renew,
approve, revoke, list), ``probe.py`` (probe),
``quarantine.py`` (quarantine list, quarantine restore). Reading ``app`` imports them,
which registers them.

The command line is the lab's edge: Typer and the reports' packages come with the
``lab`` extra (pyproject), not with the product. Without them ``main`` says so in one
line and exits 2, for every command (``host`` and ``coordinator`` too: the product's
own API, ``durable_spaces.cluster.commands``, needs none of them).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

__all__ = ["app", "main"]

#: The modules the command line imports that only the ``lab`` extra installs.
LAB_MODULES = ("typer", "rich", "pandas", "matplotlib")


def lab_missing() -> list[str]:
    """The ``LAB_MODULES`` this environment cannot import."""
    return [m for m in LAB_MODULES if importlib.util.find_spec(m) is None]


#: The command modules, each registering its commands on ``app`` when imported.
COMMAND_MODULES = ("campaigns", "cluster", "inspect", "probe", "quarantine", "tls")


def __getattr__(name: str) -> Any:
    # importlib, not ``from durable_spaces.cli import x``: that form asks this function
    # for ``x`` first, and would come back here
    if name == "app":
        for module in COMMAND_MODULES:
            importlib.import_module(f"{__name__}.{module}")
        app = importlib.import_module(f"{__name__}.app").app
        globals()["app"] = app
        return app
    # a command module read as an attribute (``durable_spaces.cli.campaigns``) is imported
    # with the others, so that its commands are on ``app`` before it is used
    if name in COMMAND_MODULES:
        __getattr__("app")
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'durable_spaces.cli' has no attribute {name!r}")


def main() -> None:  # pragma: no cover - console entry
    missing = lab_missing()
    if missing:
        print(
            f"durable-spaces: error: the command line needs the lab extra ({', '.join(missing)} "
            "not installed): pip install 'durable-spaces[lab]'",
            file=sys.stderr,
        )
        sys.exit(2)
    __getattr__("app")(prog_name="durable-spaces")
