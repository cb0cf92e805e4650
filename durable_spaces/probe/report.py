"""A probe's report (report.md and a self-contained report.html) and ``--compare``.

Both read what a probe left in its directory: ``probe.json`` (the summary and the
recipe's promise) and ``runs/*.json`` (the run records). The grade table counts each
run's steps by the kill point the run was planned at (``none``: the uninterrupted run)
and the class the checker gave them, with the grade of each row; the harness's stated
promise is shown beside its grade. The coverage table has a cell per (kill point, step)
pair: how the runs put there graded, or that none was. A probe with kill points inside
the harness's state writes (``--at state``) adds a table of them: each operation probed,
the file it wrote and the step under way in the uninterrupted run, and how its runs
graded, the unsafe ones first.
"""

from __future__ import annotations

import glob
import html
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from durable_spaces.errors import RecordError
from durable_spaces.host.bounded import load_json
from durable_spaces.probe.checker import CLASSES
from durable_spaces.probe.gates import COMMAND_WHERE, MODEL_WHERE, GatePoint
from durable_spaces.probe.grade import GRADES, grade_of
from durable_spaces.probe.record import (
    MAX_RECORD_BYTES,
    MAX_STEPS,
    ProbeRecord,
    counts,
    pairs_probed,
)

__all__ = ["compare", "coverage", "find", "render", "state_table", "tables"]

COLUMNS = (*CLASSES, "stuck")


def _meta(out: Path) -> dict[str, Any]:
    path = out / "probe.json"
    try:
        meta = load_json(path, max_bytes=MAX_RECORD_BYTES)
    except (OSError, ValueError) as e:  # BadFileError included: a FIFO, too big, too deep
        raise RecordError(f"{out} is not a probe directory ({e})") from None
    if not isinstance(meta, dict) or meta.get("kind") != "probe-summary":
        raise RecordError(f"{path} is not a probe summary")
    return meta


def _records(out: Path) -> list[ProbeRecord]:
    paths = sorted((out / "runs").glob("r*.json"), key=lambda p: (len(p.name), p.name))
    return [ProbeRecord.load(p) for p in paths if not p.name.endswith(".requests.json")]


def tables(records: Sequence[ProbeRecord]) -> list[list[str]]:
    """The grade table: a header, then one row per kill point kind."""
    rows: dict[str, Counter[str]] = {}
    classes: dict[str, list[str]] = {}
    for r in records:
        if r.outcome == "lab_error":
            continue
        where = "none" if r.point is None else r.point.where
        c = rows.setdefault(where, Counter())
        c.update(x.cls for x in r.results if x.cls != "unfinished")
        c["stuck"] += r.outcome == "stuck"
        c["runs"] += 1
        classes.setdefault(where, []).extend(r.classes)
    order = ["none", *MODEL_WHERE, *COMMAND_WHERE]
    out = [["kill point", "runs", *COLUMNS, "grade"]]
    for w in order:
        if w in rows:
            out.append([w, str(rows[w]["runs"]), *(str(rows[w][k]) for k in COLUMNS),
                        grade_of(classes[w])])  # fmt: skip
    return out


def coverage(records: Sequence[ProbeRecord], planned: Sequence[GatePoint],
             steps: int = 0) -> list[list[str]]:  # fmt: skip
    """Kill point x step: a header, then a row per kind of point; each planned pair's
    cell is how its runs graded (and how many), ``not run`` when none probed it; a pair
    not planned (the harness never reached it, or the fault does not apply) is ``-``.
    Step ``steps`` + 1 is the final answer's (``final``)."""
    by: dict[GatePoint, list[ProbeRecord]] = {}
    for r in records:
        if r.point is not None and not r.point.state:
            by.setdefault(r.point, []).append(r)
    pairs = {p for p in planned if not p.state} | set(by)
    columns = range(1, max((p.step for p in pairs), default=0) + 1)
    out = [["kill point", *("final" if k == steps + 1 else f"step {k}" for k in columns)]]
    for where in (*MODEL_WHERE, *COMMAND_WHERE):
        if not any(p.where == where for p in pairs):
            continue
        row = [where]
        for k in columns:
            p = GatePoint(k, where)
            runs = [r for r in by.get(p, []) if r.landed and r.outcome != "lab_error"]
            if runs:
                row.append(f"{grade_of(c for r in runs for c in r.classes)} ({len(runs)})")
            elif p in by:
                row.append("not landed" if any(r.outcome != "lab_error" for r in by[p])
                           else "lab error")  # fmt: skip
            else:
                row.append("not run" if p in pairs else "-")
        out.append(row)
    return out


def state_table(records: Sequence[ProbeRecord]) -> list[list[str]]:
    """The kill points inside the harness's state writes: a header, then a row per point
    some run probed (the unsafe ones first): the operation the uninterrupted run made
    there (its file, the step under way), the one the run held, and how its runs graded."""
    made = {(o["op"], o["n"]): o for r in records if r.point is None for o in r.state_ops}
    by: dict[GatePoint, list[ProbeRecord]] = {}
    for r in records:
        if r.point is not None and r.point.state and r.landed and r.outcome != "lab_error":
            by.setdefault(r.point, []).append(r)
    rows = []
    for p, runs in by.items():
        grade = grade_of(c for r in runs for c in r.classes)
        o = made.get((p.where, p.step))
        first = f"{o['path']} (step {o['step']})" if o else "-"
        paths = sorted({r.state_hit["path"] for r in runs if r.state_hit})
        held = (
            paths[0] + (f" (and {len(paths) - 1} more)" if len(paths) > 1 else "") if paths else ""
        )
        classes = "; ".join(" ".join(f"{x.cls}@{x.step}" for x in r.results) or r.outcome
                            for r in runs)  # fmt: skip
        rows.append((-GRADES.index(grade) if grade in GRADES else 1, p, [
            str(p), first, held or "-", grade, classes]))  # fmt: skip
    rows.sort(key=lambda x: (x[0], x[1]))
    return [["state operation", "in the uninterrupted run", "held", "grade", "steps"],
            *(r for _, _, r in rows)]  # fmt: skip


def _planned(meta: dict[str, Any]) -> list[GatePoint]:
    """The pairs the probe planned (``pairs`` of probe.json; checked: they name points)."""
    raw = meta.get("pairs", [])
    if not isinstance(raw, list):
        raise RecordError("probe.json: pairs is not a list")
    try:
        out = [GatePoint.parse(str(x)) for x in raw]
    except ValueError as e:
        raise RecordError(f"probe.json: a pair is malformed: {e}") from None
    if any(p.step > MAX_STEPS + 1 for p in out):  # the final answer's points are K+1
        raise RecordError(f"probe.json: a pair's step is past {MAX_STEPS + 1}")
    return out


def power_cuts(records: Sequence[ProbeRecord]) -> str:
    """What the power fault's cuts dropped of the harness's state directory, in all."""
    cuts = [a["dropped"] for r in records for a in r.attempts
            if isinstance(a.get("dropped"), dict)]  # fmt: skip
    try:
        ops = sum(int(c.get("ops", 0)) for c in cuts)
        size = sum(int(c.get("bytes", 0)) for c in cuts)
    except (TypeError, ValueError) as e:
        raise RecordError(f"a run record's power cut is malformed: {e}") from None
    return (f"{len(cuts)} cuts of the state directory (powerfs) dropped {ops} unsynced "
            f"operations, {size} bytes")  # fmt: skip


def _md(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + " --- |" * len(rows[0])]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines) + "\n"


def _html_table(rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(x)}</th>" for x in rows[0])
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(x)}</td>" for x in r) + "</tr>" for r in rows[1:]
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render(out: Path) -> tuple[Path, Path]:
    """Write ``out``/report.md and report.html; their paths."""
    meta = _meta(out)
    records = _records(out)
    grid = tables(records)
    planned = _planned(meta)
    cover = coverage(records, planned, int(meta["steps"]))
    state = state_table(records)
    probed = len(pairs_probed(records) & set(planned))
    cover_title = f"Kill point x step: {probed} of {len(planned)} planned pairs probed"
    failed = [r for r in records if r.failed]
    promise = meta.get("promise") or "(none stated)"
    title = f"Probe of {meta['harness']}: {meta['grade']}"
    facts = [
        ("grade", str(meta["grade"])), ("promise", promise),
        ("fault", str(meta["fault"])), ("scenario", str(meta["scenario"])),
        ("steps", str(meta["steps"])), ("seed base", str(meta["seed_base"])),
        ("recipe", str(meta["recipe"])),
        ("the model's call ids", str(meta.get("call_ids", "per-step")) + (
            " (new at every answer)" if meta.get("call_ids") == "per-answer"
            else " (the step's own: a harness that asks again gets the same id)")),
        ("the harness's report of an interruption ([report])",
         str(meta.get("report") or "none declared: results without the step's output are "
             "unverified")),
    ]  # fmt: skip
    unverified = counts(records)["unverified"]
    if unverified:
        facts.append(
            (
                "unverified",
                f"{unverified} steps were first shown a result without "
                "the step's output and without the harness's declared report: a report "
                "in other words or a made-up success; the grade says neither",
            )
        )
    if str(meta["grade"]).startswith("partial:"):
        facts.append(
            (
                "coverage",
                f"{probed} of {len(planned)} kill point x step pairs probed: "
                "the grade is the worst class seen so far",
            )
        )
    if meta["fault"] == "power":
        facts.append(("power cuts", power_cuts(records)))
    md = [f"# {title}\n", *(f"- {k}: {v}" for k, v in facts), "", f"`{meta['summary']}`\n",
          "## Steps by kill point and class\n", _md(grid),
          f"## {cover_title}\n", _md(cover)]  # fmt: skip
    if len(state) > 1:
        md += ["## Kill points inside the harness's state writes\n", _md(state)]
    if meta.get("reason"):
        md.append(f"Not a clean verdict: {meta['reason']}\n")
    if failed:
        md.append("## Runs worse than at-most-once-reported\n")
        md += [f"- {r.run_id} ({r.why()}): `durable-spaces repro {out / 'runs' / r.run_id}.json`"
               for r in failed]  # fmt: skip
        md.append("")
    md_path = out / "report.md"
    md_path.write_text("\n".join(md) + "\n")
    items = "".join(f"<li>{html.escape(k)}: <b>{html.escape(v)}</b></li>" for k, v in facts)
    runs = "".join(f"<li>{html.escape(r.run_id)} ({html.escape(r.why())})</li>" for r in failed)
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #999;padding:.2em .6em;text-align:right}"
        "td:first-child,th:first-child{text-align:left}code{font-size:90%}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><ul>{items}</ul>"
        f"<p><code>{html.escape(str(meta['summary']))}</code></p>"
        f"<h2>Steps by kill point and class</h2>{_html_table(grid)}"
        f"<h2>{html.escape(cover_title)}</h2>{_html_table(cover)}"
        + (f"<h2>Kill points inside the harness's state writes</h2>{_html_table(state)}"
           if len(state) > 1 else "")
        + (f"<p>Not a clean verdict: {html.escape(str(meta['reason']))}</p>"
           if meta.get("reason") else "")
        + (f"<h2>Runs worse than at-most-once-reported</h2><ul>{runs}</ul>" if failed else "")
        + "</body></html>\n"
    )  # fmt: skip
    html_path = out / "report.html"
    html_path.write_text(page)
    return md_path, html_path


def find(name_or_dir: Path, root: Path = Path("probe-out")) -> Path:
    """A probe directory: ``name_or_dir`` itself, or the newest probe of the harness it
    names under ``root`` (where ``probe`` puts them without ``--out``)."""
    if name_or_dir.is_dir():
        return name_or_dir
    name = str(name_or_dir)
    found = sorted(
        (d for d in root.glob(f"{glob.escape(name)}-*") if (d / "probe.json").is_file()),
        key=lambda d: (d / "probe.json").stat().st_mtime,
    )
    if "/" in name or not found:
        raise RecordError(f"{name} is neither a probe directory nor a harness probed in {root}")
    return found[-1]


def _pairs(meta: dict[str, Any]) -> str:
    """``x/y`` from the probe's SUMMARY line (what it printed), else ``-``."""
    for word in str(meta.get("summary", "")).split():
        if word.startswith("pairs="):
            return word.removeprefix("pairs=")[:40]
    return "-"


def compare(dirs: Sequence[Path]) -> str:
    """Several probes side by side: one Markdown table, a row per probe directory."""
    rows = [["harness", "fault", "scenario", "runs", "steps", *COLUMNS, "kills", "pairs",
             "grade", "call ids", "promise"]]  # fmt: skip
    for d in dirs:
        meta = _meta(d)
        c = counts(_records(d))
        rows.append([
            str(meta["harness"]), str(meta["fault"]), str(meta["scenario"]), str(meta["runs"]),
            str(c["steps"]), *(str(c[k]) for k in COLUMNS), str(c["kills"]), _pairs(meta),
            str(meta["grade"]), str(meta.get("call_ids", "per-step")),
            str(meta.get("promise") or "-"),
        ])  # fmt: skip
    return _md(rows)
