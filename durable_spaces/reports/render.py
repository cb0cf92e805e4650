"""A campaign directory to ``report.md`` and ``report.html`` (PNGs embedded in the HTML).

The Markdown links the PNGs next to it; the HTML carries them inline (base64) so it can
be mailed or attached to an issue as one file. Tables are rendered here rather than by
``DataFrame.to_markdown`` to avoid an extra dependency (tabulate).

The directory is read as data from outside: a run record that is not one is skipped and
listed (``Report.skipped``, and a section of the report), a malformed ``campaign.json``
is ignored, every string from a record is escaped for Markdown and HTML, and each output
file is written to a fresh temporary name and renamed over the target, so a symlink
planted at ``report.md`` is replaced, never followed.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from durable_spaces.campaigns.record import MAX_RECORD_BYTES, RecordScan, scan_records
from durable_spaces.campaigns.trace_coverage import killed_at
from durable_spaces.errors import BadFileError
from durable_spaces.host.bounded import load_json
from durable_spaces.reports import failed_runs
from durable_spaces.reports.coverage import (
    campaign_coverage,
    checks_table,
    coverage_table,
    kills_heatmap,
    never_hit_table,
)
from durable_spaces.reports.output import write_file
from durable_spaces.reports.plots import latency_plot, recoveries_plot
from durable_spaces.reports.tables import all_tables


def _flat(text: object) -> str:
    """One line: control characters (newlines included) become spaces."""
    return re.sub(r"[\x00-\x1f\x7f]+", " ", str(text))


def _cell(v: object) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return ""
    return _flat(v).replace("|", "\\|")


def code_span(text: object) -> str:
    """``text`` as one Markdown code span, whatever backticks it holds."""
    t = _flat(text)
    fence = "`" * (max((len(m) for m in re.findall(r"`+", t)), default=0) + 1)
    pad = " " if t.startswith("`") or t.endswith("`") else ""
    return f"{fence}{pad}{t}{pad}{fence}"


def _meta(path: Path) -> tuple[dict[str, Any], str | None]:
    """``campaign.json`` if it is a JSON object, else nothing and why."""
    if not path.exists() and not path.is_symlink():
        return {}, None
    try:
        meta = load_json(path, max_bytes=MAX_RECORD_BYTES, follow=False)
    except BadFileError as e:
        return {}, str(e).removeprefix(f"{path}: ").removeprefix(f"{path} ")
    except OSError as e:
        return {}, f"cannot be read: {e.strerror or e}"
    if not isinstance(meta, dict):
        return {}, "not a JSON object"
    return meta, None


def _repro_info(r: Any) -> dict[str, Any] | None:
    info = r.extra.get("reproduction")
    return info if isinstance(info, dict) else None


def _reproduced(r: Any) -> str:
    """ " (reproduced k/N)" for a failed run replayed exactly, flagged when never."""
    info = _repro_info(r)
    if info is None:
        return ""
    k, n = info.get("reproduced"), info.get("tries")
    flag = ", never reproduced: see how the replays differed" if k == 0 else ""
    return f" (reproduced {_cell(k)}/{_cell(n)}{flag})"


def _determinism(path: Path) -> str | None:
    """The determinism figure of ``durable-spaces campaign --determinism`` (if run)."""
    meta, _ = _meta(path)
    if not meta:
        return None
    seeds, same = meta.get("seeds"), meta.get("same")
    return (
        f"{same} of {seeds} seeds realized the same interleaving twice "
        f"(fraction {meta.get('fraction')}, profile {meta.get('profile')})"
    )


def _html_table(df: pd.DataFrame) -> str:
    """A table in a box of its own that scrolls, so a wide one never widens the page."""
    return f"<div class='t'>{df.to_html(index=False, na_rep='')}</div>"


def markdown_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "_(none)_"
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(" --- " for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Report:
    markdown: Path
    html: Path
    images: list[Path]
    tables: dict[str, pd.DataFrame]
    #: Files under ``runs/`` that are not run records, with the reason; left out.
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    #: How many run records the report is made of.
    runs: int = 0


def render_report(campaign_dir: str | Path, scan: RecordScan | None = None) -> Report:
    """Write the report files into ``campaign_dir`` and return their paths and tables
    (``scan``: its records as the caller read them, else read here)."""
    d = Path(campaign_dir)
    scan = scan_records(d) if scan is None else scan
    records = scan.records
    skipped = list(scan.skipped)
    tables = all_tables(records)
    images = [
        latency_plot(records, d / "resume_latency.png"),
        recoveries_plot(records, d / "recoveries.png"),
    ]
    tested: dict[str, pd.DataFrame] = {"Checks: runs and what each verified": checks_table(records)}
    cov = campaign_coverage(records)
    meta, bad_meta = _meta(d / "campaign.json")
    cov_line = ""
    if cov is not None:
        cov_line = cov.line()
        if (plan := killed_at(cov, meta.get("exhaustive"))) is not None:
            cov_line = f"{plan.line()}. All attempts: {cov_line}"
        tested = {
            "Coverage: failpoints passed and killed at, per call kind": coverage_table(cov),
            "Registered failpoints never passed": never_hit_table(cov),
            **tested,
        }
        heat = kills_heatmap(cov, d / "kills_heatmap.png")
        if heat is not None:
            images.insert(0, heat)
    if bad_meta is not None:
        skipped.append((d / "campaign.json", bad_meta))
    summary = _flat(meta.get("summary", "")) if isinstance(meta.get("summary"), str) else ""
    title = f"Campaign report: {_flat(d.name)}"
    failed = [r for r in records if r.outcome != "ok"]

    drawn = failed_runs.draw(d, failed)
    for r in failed:
        failed_runs.write_page(d, r, drawn.get(r.run_id))

    md = [f"# {title}", ""]
    if summary:
        md += ["```", summary, "```", ""]
    md += ["## What was tested", "", _cell(cov_line or "no failpoint traces in these records"), ""]
    for name, df in tested.items():
        md += [f"### {name}", "", markdown_table(df), ""]
    for name, df in tables.items():
        md += [f"## {name}", "", markdown_table(df), ""]
    md += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in images] + [""]
    md += ["## Failed runs", ""]
    md += [f"- {code_span(r.run_id)} ({_cell(', '.join(r.failing_checks()) or r.outcome)}): "
           f"{code_span(r.repro)}{_reproduced(r)}" for r in failed] or ["_(none)_"]  # fmt: skip
    for r in failed:
        exact = code_span(failed_runs.exact_line(d, r))
        md += [f"### {code_span(r.run_id)}", "", f"- exact: {exact}",
               f"- record: [runs/{r.run_id}.json](runs/{r.run_id}.json), page: "
               f"[failed/{r.run_id}.html](failed/{r.run_id}.html)"]  # fmt: skip
        if r.run_id in drawn:
            md += [f"- timeline: ![timeline](failed/{r.run_id}.png)"]
        md += failed_runs.anomalies_markdown(r, _cell)
        for diff in (_repro_info(r) or {}).get("differences", []) or []:
            md += [f"  - a replay that passed differed: {_cell('; '.join(map(str, diff)))}"]
    det = _determinism(d / "determinism.json")
    if det is not None:
        md += ["", "## Determinism", "", _cell(det), ""]
    if skipped:
        md += ["", "## Skipped files", ""]
        md += [f"- {code_span(p.name)}: {_cell(why)}" for p, why in skipped]
    md_path = write_file(d / "report.md", ("\n".join(md) + "\n").encode())

    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
             f"</title><style>{failed_runs.STYLE}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>"]  # fmt: skip
    if summary:
        parts.append(f"<pre>{html.escape(summary)}</pre>")
    tested_line = cov_line or "no failpoint traces in these records"
    parts += ["<h2>What was tested</h2>", f"<p>{html.escape(tested_line)}</p>"]
    for name, df in tested.items():
        body = "<p><em>(none)</em></p>" if df.empty else _html_table(df)
        parts += [f"<h3>{html.escape(name)}</h3>", body]
    for name, df in tables.items():
        body = "<p><em>(none)</em></p>" if df.empty else _html_table(df)
        parts += [f"<h2>{html.escape(name)}</h2>", body]
    parts.append("<h2>Plots</h2>")
    for p in images:
        data = base64.b64encode(p.read_bytes()).decode()
        parts.append(f"<p><img alt='{p.stem}' src='data:image/png;base64,{data}'></p>")
    parts.append("<h2>Failed runs</h2>")
    if not failed:
        parts.append("<p><em>(none)</em></p>")
    for r in failed:
        rid = html.escape(r.run_id)
        parts += [f"<h3 id='{rid}'><code>{rid}</code>{html.escape(_reproduced(r))}</h3>",
                  f"<pre>{html.escape(r.repro)}\n"
                  f"{html.escape(failed_runs.exact_line(d, r))}</pre>",
                  f"<p><a href='failed/{rid}.html'>its page</a> &middot; "
                  f"<a href='runs/{rid}.json'>its record</a></p>"]  # fmt: skip
        if r.run_id in drawn:
            parts.append(f"<p>{failed_runs.img_tag(drawn[r.run_id], 'timeline')}</p>")
        parts.append(failed_runs.anomalies_html(r))
    if det is not None:
        parts += ["<h2>Determinism</h2>", f"<p>{html.escape(det)}</p>"]
    if skipped:
        parts.append("<h2>Skipped files</h2><ul>")
        parts += [f"<li><code>{html.escape(p.name)}</code>: {html.escape(why)}</li>"
                  for p, why in skipped]  # fmt: skip
        parts.append("</ul>")
    parts.append("</body></html>")
    html_path = write_file(d / "report.html", ("\n".join(parts) + "\n").encode())
    return Report(md_path, html_path, images, tables, skipped, len(records))
