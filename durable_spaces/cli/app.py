"""The ``durable-spaces`` Typer app and what every command shares: one-line errors.

Bad input ends in one line, ``durable-spaces: error: <what>``, and exit 2 (a bad
argument, as click's own usage errors) or 1 (a failure to do what was asked), never a
traceback: ``_OneLineErrors`` flattens click's multi-line usage errors and turns the
package's typed errors into that line too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from durable_spaces.chaos import mutants
from durable_spaces.errors import ConfigError, DurableSpacesError
from durable_spaces.settings import Settings

#: click's exceptions as this typer raises them (newer typers vendor their own click).
_click_errors: Any = sys.modules[typer.BadParameter.__module__]


class _Never(Exception):
    """Stands in for click's NoArgsIsHelpError where click has none (before 8.2)."""


_NO_ARGS_IS_HELP: type[Exception] = getattr(_click_errors, "NoArgsIsHelpError", _Never)


def one_line(text: str) -> str:
    return " ".join(str(text).split())


class _OneLineErrors(TyperGroup):
    """Every error a user can cause as one ``durable-spaces: error: ...`` line."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            # A malformed DS_* setting, the product's or the lab's: one line, before any
            # work (the lab's module is imported for it: a command is an edge of both).
            Settings.from_env()
            from durable_spaces.campaigns.spec import LabSettings

            LabSettings.from_env()
            if (bad := mutants.problem()) is not None:  # DS_MUTANTS=nope, the same
                raise ConfigError(bad)
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _NO_ARGS_IS_HELP as e:
            e.show()  # type: ignore[attr-defined]  # the help text itself, as before
            code = e.exit_code  # type: ignore[attr-defined]
        except _click_errors.ClickException as e:
            hint = " (see --help)" if isinstance(e, _click_errors.UsageError) else ""
            typer.echo(f"durable-spaces: error: {one_line(e.format_message())}{hint}", err=True)
            code = e.exit_code
        except typer.Abort:
            typer.echo("durable-spaces: error: aborted", err=True)
            code = 1
        except (DurableSpacesError, OSError) as e:
            typer.echo(f"durable-spaces: error: {one_line(str(e))}", err=True)
            code = 1
        else:
            code = rv if isinstance(rv, int) else 0
        if not standalone_mode:
            return code
        sys.exit(code)


app = typer.Typer(
    name="durable-spaces",
    help="Keep a Space consistent with its durable log; the chaos lab that proves it.",
    no_args_is_help=True,
    add_completion=False,
    cls=_OneLineErrors,
)


def fail(msg: str, code: int = 2) -> typer.Exit:
    typer.echo(f"durable-spaces: error: {one_line(msg)}", err=True)
    return typer.Exit(code)


def usable_dir(option: str, path: Path) -> Path:
    """``path`` as an absolute directory we can write: made (with parents) if missing;
    ``_fail`` if it is a file, a dangling symlink, or cannot be made or written."""
    path = path.absolute()
    if path.exists() and not path.is_dir():
        raise fail(f"{option} {path} exists and is not a directory")
    if path.is_symlink() and not path.exists():
        raise fail(f"{option} {path} is a dangling symbolic link")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise fail(f"{option} {path} cannot be created: {e.strerror or e}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise fail(f"{option} {path} is not writable")
    return path
