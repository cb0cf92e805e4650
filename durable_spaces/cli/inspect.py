"""``report``, ``check`` and ``diff``: reading what campaigns and sessions left behind."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated

import typer

from durable_spaces.campaigns.spec import BACKENDS
from durable_spaces.cli.app import app, fail, one_line
from durable_spaces.errors import DurableSpacesError

_ENTRY = re.compile(r"e[1-9][0-9]{0,17}", re.ASCII)
_CONVERSATION = re.compile(r"c[1-9][0-9]{0,17}", re.ASCII)


@app.command("report")
def report_cmd(
    directory: Annotated[
        Path | None, typer.Argument(help="a campaign directory (omit with --compare)")
    ] = None,
    compare: Annotated[
        tuple[Path, Path] | None,
        typer.Option("--compare", help="two campaign directories: a table of what changed"),
    ] = None,
) -> None:
    """Write report.md and report.html (tables and plots) into a campaign directory.
    A run record that cannot be read is skipped with a warning line naming it.
    ``--compare A B`` prints what changed from A to B instead."""
    if compare is not None:
        if directory is not None:
            raise fail("give either a campaign directory or --compare A B, not both")
        _compare(*compare)
        return
    if directory is None:
        raise fail("give a campaign directory (one with runs/), or --compare A B")
    if not directory.is_dir():
        what = "does not exist" if not directory.exists() else "is not a directory"
        raise fail(f"{directory} {what}; give a campaign directory (one with runs/)")
    if directory.joinpath("runs").is_symlink() or not (directory / "runs").is_dir():
        raise fail(f"{directory} is not a campaign directory (no runs/ directory)")
    from durable_spaces.campaigns.record import scan_records
    from durable_spaces.reports.render import render_report

    scan = scan_records(directory)
    if not scan.records:  # an empty report would look like a campaign that ran nothing
        first = f" (first: {scan.skipped[0][0].name}: {scan.skipped[0][1]})" if scan.skipped else ""
        raise fail(
            f"{directory / 'runs'}: no run record could be read, of "
            f"{len(scan.skipped)} file(s){first}; no report written",
            1,
        )
    rep = render_report(directory, scan)
    _warn_skipped(rep.skipped, rep.runs)
    typer.echo(str(rep.markdown))
    typer.echo(str(rep.html))


def _warn_skipped(skipped: list[tuple[Path, str]], runs: int | None) -> None:
    """One warning line per run record file left out, then how many (of how many)."""
    for path, why in skipped:
        typer.echo(f"durable-spaces: warning: skipped {path}: {one_line(why)}", err=True)
    if skipped:
        n = len(skipped)
        of = "" if runs is None else f" of {n + runs}"
        typer.echo(f"durable-spaces: warning: skipped {n}{of} run records", err=True)


def _compare(a: Path, b: Path) -> None:
    from durable_spaces.reports.compare import compare
    from durable_spaces.reports.render import markdown_table

    skipped: list[tuple[Path, str]] = []
    try:
        table = compare(a, b, skipped)
    except DurableSpacesError as e:
        _warn_skipped(skipped, None)
        raise fail(str(e)) from None
    _warn_skipped(skipped, None)  # the table's first row says how many were compared
    typer.echo(f"A = {a}\nB = {b}\n")
    typer.echo(markdown_table(table))


@app.command("check")
def check_cmd(
    run_dir: Annotated[Path, typer.Argument(help="a run's directory kept with --keep")],
) -> None:
    """Re-run the checker offline on a kept run; exit 1 if a check is not valid."""
    from durable_spaces.campaigns.checker import check_all, merge
    from durable_spaces.campaigns.checks.kept import load

    try:
        verdicts = check_all(load(run_dir))
    except (DurableSpacesError, OSError) as e:
        raise fail(str(e)) from None
    typer.echo(json.dumps(verdicts, indent=2, sort_keys=True))
    valid = merge(verdicts)
    failing = ",".join(sorted(k for k, v in verdicts.items() if v["valid"] is not True)) or "-"
    typer.echo(f"CHECK {run_dir} valid={valid} failing={failing}")
    raise typer.Exit(0 if valid is True else 1)


@app.command()
def diff(
    state_dir: Annotated[Path, typer.Argument(help="a session's state directory (log.sqlite)")],
    entry_a: Annotated[str, typer.Argument(help="the earlier entry id, e.g. e12")],
    entry_b: Annotated[str, typer.Argument(help="the later entry id")],
    backend: Annotated[str | None, typer.Option(help="Space backend (default: agent.json)")] = None,
    backend_dir: Annotated[Path | None, typer.Option(help="the backend's state dir")] = None,
    store: Annotated[Path | None, typer.Option(help="a DirectoryCheckpointStore")] = None,
    conversation: Annotated[str | None, typer.Option(help="conversation id")] = None,
) -> None:
    """Show how the workspace differs between two entries of a session's log."""
    from durable_spaces.cli.review_diff import review_diff_main

    for what, eid in (("ENTRY_A", entry_a), ("ENTRY_B", entry_b)):
        if not _ENTRY.fullmatch(eid):
            raise fail(f"{what} must be an entry id like e12, got {eid!r}")
    if conversation is not None and not _CONVERSATION.fullmatch(conversation):
        raise fail(f"--conversation must be a conversation id like c1, got {conversation!r}")
    if not state_dir.is_dir():
        raise fail(f"STATE_DIR {state_dir} is not a directory")
    log = state_dir / "log.sqlite"
    if log.is_symlink() or not log.is_file():
        raise fail(f"STATE_DIR {state_dir} holds no log (log.sqlite)")
    for option, d in (("--backend-dir", backend_dir), ("--store", store)):
        if d is not None and not d.is_dir():  # opening a backend would create it
            raise fail(f"{option} {d} is not a directory")
    if backend is not None and backend not in BACKENDS:
        raise fail(f"--backend={backend!r} is not one of: {', '.join(BACKENDS)}")
    try:
        text = review_diff_main(
            state_dir, backend, backend_dir, entry_a, entry_b,
            store_dir=store, conversation_id=conversation,
        )  # fmt: skip
    except (DurableSpacesError, OSError, KeyError) as e:
        raise fail(str(e), 1) from None
    typer.echo(text)
