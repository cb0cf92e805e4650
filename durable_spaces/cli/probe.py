"""``probe``: crash-test an agent harness from its recipe (docs/probe.md).

``durable-spaces probe --harness NAME_OR_RECIPE`` runs the probe (durable_spaces/probe/)
and ends with its SUMMARY line; ``durable-spaces probe --compare DIR...`` tabulates
probes already run. Exit codes: 0 the lab worked, 1 ``--expect`` and the grade is worse,
2 bad input (a recipe's launch or resume program that cannot start too), 3 a run broke in
the lab or the uninterrupted run could not be judged, 4 not tested (no fault landed where
planned).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from durable_spaces.cli.app import app, fail, usable_dir
from durable_spaces.errors import ConfigError, RecordError


@app.command()
def probe(
    harness: Annotated[str | None, typer.Option(
        help="a built-in recipe's name, or a recipe.toml (or its directory)")] = None,
    scenario: Annotated[str, typer.Option(
        help="random (seeded draws) or exhaustive (every reached point once)")] = "random",
    fault: Annotated[str, typer.Option(
        help="process, machine, power, model-5xx, model-cut or model-slow")] = "process",
    runs: Annotated[int, typer.Option(help="random: runs with a fault")] = 20,
    steps: Annotated[int, typer.Option(help="steps of the task")] = 5,
    seed_base: Annotated[str, typer.Option(help="seeds are <seed-base>-<i>")] = "probe",
    jobs: Annotated[int, typer.Option(help="runs in parallel")] = 2,
    out: Annotated[Path | None, typer.Option(help="the probe's directory")] = None,
    expect: Annotated[str | None, typer.Option(
        help="exit 1 when the grade is worse than this one")] = None,
    keep: Annotated[bool, typer.Option(help="keep every run's workdir and state")] = False,
    at: Annotated[str | None, typer.Option(
        help="only these kill points, comma-separated (request,stream,started,effect,exited; "
             "write,fsync,rename or state: inside the harness's state writes; all)"
    )] = None,
    call_ids: Annotated[str, typer.Option(
        help="the model's tool call ids: per-answer (new at every answer, as a real model "
             "gives them) or per-step (the older ids, the step's own)")] = "per-answer",
    allow_partial: Annotated[bool, typer.Option(
        help="--expect accepts a grade from a probe that covered only some kill point x "
             "step pairs (partial:...)")] = False,
    effect_server: Annotated[bool, typer.Option(
        "--effect-server", help="shell steps also POST to an effect server on 127.0.0.1 "
        "(with DS_CALL_KEY as Idempotency-Key when the harness gives one); each step's "
        "count there is graded too")] = False,
    report: Annotated[bool, typer.Option(help="write report.md/html at the end")] = True,
    compare: Annotated[bool, typer.Option(
        "--compare", help="instead: tabulate the probes in the directories given")] = False,
    dirs: Annotated[list[Path] | None, typer.Argument(
        help="with --compare: probe directories, or harness names (their newest probe in "
             "./probe-out)", show_default=False)] = None,
) -> None:  # fmt: skip
    """Crash-test an agent harness: kill it at every point a black box allows, resume it,
    grade what its workspace and its model saw; SUMMARY is the last line."""
    from durable_spaces.probe import report as reports

    if compare:
        if harness is not None or not dirs:
            raise fail("--compare takes probe directories (and no --harness)")
        try:
            typer.echo(reports.compare([reports.find(d) for d in dirs]), nl=False)
        except (RecordError, ConfigError) as e:
            raise fail(str(e)) from None
        raise typer.Exit(0)
    if dirs:
        raise fail(f"unexpected argument {dirs[0]} (directories go with --compare)")
    if harness is None:
        raise fail("give --harness NAME_OR_RECIPE (or --compare DIR...)")
    if call_ids not in ("per-answer", "per-step"):
        raise fail(f"--call-ids {call_ids}: per-answer or per-step")
    from durable_spaces.probe.recipe import load
    from durable_spaces.probe.whole_probe import ProbeSpec, run_probe

    try:
        recipe = load(harness)
    except ConfigError as e:
        raise fail(str(e)) from None
    if out is None:
        out = Path("probe-out") / f"{recipe.name}-{fault}-{time.strftime('%Y%m%d-%H%M%S')}"
    spec = ProbeSpec(
        recipe=recipe, out=out, scenario=scenario, fault=fault, runs=runs, steps=steps,
        seed_base=seed_base, jobs=jobs, expect=expect, keep=keep,
        at=tuple(x.strip() for x in at.split(",") if x.strip()) if at else (),
        per_step=call_ids == "per-step", allow_partial=allow_partial, effects=effect_server,
    )  # fmt: skip
    try:
        spec.check()  # before the directory is made: bad input leaves nothing behind
    except ConfigError as e:
        raise fail(str(e)) from None
    out = usable_dir("--out", out)
    if (out / "runs").exists() and any((out / "runs").iterdir()):
        raise fail(f"{out} already holds a probe's runs: give another --out")
    spec = replace(spec, out=out)
    try:
        result = run_probe(spec)
    except ConfigError as e:
        raise fail(str(e)) from None
    if report:
        rep = reports.render(out)
        typer.echo(f"report: {rep[0]} {rep[1]}", err=True)
    if result.reason:
        typer.echo(f"durable-spaces: probe: {result.reason}", err=True)
    raise typer.Exit(result.exit_code)


def repro_probe(path: Path, state_dir: Path | None) -> int:
    """``durable-spaces repro RECORD`` for a probe run's record: the same run again."""
    from durable_spaces.probe.whole_probe import replay

    if state_dir is None:
        state_dir = Path("probe-out") / "repro" / f"{path.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    state_dir = usable_dir("--state-dir", state_dir)
    try:
        return replay(path, state_dir)
    except (RecordError, ConfigError) as e:
        raise fail(f"{path}: {e}") from None
