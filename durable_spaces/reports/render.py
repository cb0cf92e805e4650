"""A campaign directory to ``report.md`` and ``report.html`` (PNGs embedded in the HTML).

The Markdown links the PNGs next to it; the HTML carries them inline (base64) so it can
be mailed or attached to an issue as one file. Tables are rendered here rather than by
``DataFrame.to_markdown`` to avoid an extra dependency (tabulate).
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from durable_spaces.campaigns.record import load_records
from durable_spaces.reports.plots import latency_plot, recoveries_plot
from durable_spaces.reports.tables import all_tables


def _cell(v: object) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return ""
    return str(v).replace("|", "\\|").replace("\n", " ")


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


def render_report(campaign_dir: str | Path) -> Report:
    """Write the report files into ``campaign_dir`` and return their paths and tables."""
    d = Path(campaign_dir)
    records = load_records(d)
    tables = all_tables(records)
    images = [
        latency_plot(records, d / "resume_latency.png"),
        recoveries_plot(records, d / "recoveries.png"),
    ]
    meta_path = d / "campaign.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    summary = meta.get("summary", "")
    title = f"Campaign report: {d.name}"
    failed = [r for r in records if r.outcome != "ok"]

    md = [f"# {title}", ""]
    if summary:
        md += ["```", summary, "```", ""]
    for name, df in tables.items():
        md += [f"## {name}", "", markdown_table(df), ""]
    md += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in images] + [""]
    md += ["## Failed runs", ""]
    md += [f"- `{r.run_id}` ({', '.join(r.failing_checks()) or r.outcome}): `{r.repro}`"
           for r in failed] or ["_(none)_"]  # fmt: skip
    md_path = d / "report.md"
    md_path.write_text("\n".join(md) + "\n")

    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
             "</title><style>body{font-family:sans-serif;max-width:70em;margin:auto}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}"
             "</style></head><body>", f"<h1>{html.escape(title)}</h1>"]  # fmt: skip
    if summary:
        parts.append(f"<pre>{html.escape(summary)}</pre>")
    for name, df in tables.items():
        body = "<p><em>(none)</em></p>" if df.empty else df.to_html(index=False, na_rep="")
        parts += [f"<h2>{html.escape(name)}</h2>", body]
    parts.append("<h2>Plots</h2>")
    for p in images:
        data = base64.b64encode(p.read_bytes()).decode()
        parts.append(f"<p><img alt='{p.stem}' src='data:image/png;base64,{data}'></p>")
    parts.append("<h2>Failed runs</h2><ul>")
    parts += [f"<li><code>{html.escape(r.run_id)}</code>: <code>{html.escape(r.repro)}</code></li>"
              for r in failed] or ["<li><em>(none)</em></li>"]  # fmt: skip
    parts.append("</ul></body></html>")
    html_path = d / "report.html"
    html_path.write_text("\n".join(parts) + "\n")
    return Report(md_path, html_path, images, tables)
