"""A failed run as a reader needs it: its timeline, its anomalies with their witnesses,
the two repro lines, a link to its record, and a page of its own (``failed/<run>.html``,
self-contained) that the report links.
"""

from __future__ import annotations

import base64
import html
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durable_spaces.campaigns.record import RunRecord
from durable_spaces.reports.output import write_file
from durable_spaces.reports.timeline import timeline_plot

#: The report draws at most this many failed runs (the rest are listed).
MAX_DRAWN = 20
#: Anomalies shown per failing check.
MAX_ANOMALIES = 10

STYLE = (
    "body{font-family:sans-serif;max-width:70em;margin:auto;padding:0 1em;"
    "overflow-wrap:anywhere}"
    "table{border-collapse:collapse}.t{overflow-x:auto;max-width:100%}"
    "td,th{border:1px solid #ccc;padding:2px 6px}"
    "pre,code{white-space:pre-wrap;word-break:break-all}img{max-width:100%}"
)


def exact_line(campaign_dir: Path, record: RunRecord) -> str:
    return shlex.join(
        ["durable-spaces", "repro", "--exact", str(campaign_dir / "runs" / f"{record.run_id}.json")]
    )


def img_tag(png: Path, alt: str) -> str:
    data = base64.b64encode(png.read_bytes()).decode()
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{data}'>"


def anomalies_html(record: RunRecord) -> str:
    parts = ["<ul>"]
    for name in record.failing_checks():
        c: dict[str, Any] = dict(record.checks.get(name) or {})
        parts.append(
            f"<li><b>{html.escape(name)}</b> (valid={html.escape(str(c.get('valid')))}): "
            f"{html.escape(str(c.get('detail', '')))}<ul>"
        )
        for a in (c.get("anomalies") or [])[:MAX_ANOMALIES]:
            parts.append(
                f"<li><code>{html.escape(str(a.get('name')))}</code> "
                f"{html.escape(str(a.get('path') or ''))}: {html.escape(str(a.get('detail')))}"
                f" <em>witness</em> <code>{html.escape(str(a.get('witness')))}</code></li>"
            )
        parts.append("</ul></li>")
    parts.append("</ul>")
    return "".join(parts)


def anomalies_markdown(record: RunRecord, cell: Callable[[object], str]) -> list[str]:
    """The failing checks and their first anomalies as Markdown list items; every string
    from the record goes through ``cell`` (one line, escaped)."""
    out = []
    for name in record.failing_checks():
        c: dict[str, Any] = dict(record.checks.get(name) or {})
        out.append(f"  - {cell(name)}: {cell(str(c.get('detail', ''))[:300])}")
        for a in (c.get("anomalies") or [])[:MAX_ANOMALIES]:
            out.append(
                f"    - {cell(a.get('name'))} {cell(a.get('path') or '')}: "
                f"{cell(str(a.get('detail'))[:200])} (witness {cell(a.get('witness'))})"
            )
    return out


def draw(campaign_dir: Path, failed: list[RunRecord]) -> dict[str, Path]:
    """Each drawn failed run's timeline PNG (``failed/<run>.png``), by run id."""
    out: dict[str, Path] = {}
    target = campaign_dir / "failed"
    for r in failed[:MAX_DRAWN]:
        target.mkdir(exist_ok=True)
        png = timeline_plot(r, target / f"{r.run_id}.png")
        if png is not None:
            out[r.run_id] = png
    return out


def write_page(campaign_dir: Path, record: RunRecord, png: Path | None) -> Path:
    """``failed/<run>.html``: the run's timeline, anomalies, repro lines and record."""
    target = campaign_dir / "failed"
    target.mkdir(exist_ok=True)
    title = f"Failed run {record.run_id}"
    body = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
        f"<p>seed <code>{html.escape(record.seed)}</code>, outcome "
        f"{html.escape(record.outcome)}, {record.attempts} attempts, {record.kills} kills; "
        f"<a href='../runs/{html.escape(record.run_id)}.json'>its record</a></p>",
        "<h2>Timeline</h2>",
        img_tag(png, "timeline") if png is not None else "<p><em>(no trace)</em></p>",
        "<h2>Anomalies</h2>",
        anomalies_html(record),
        "<h2>Reproduce</h2>",
        f"<pre>{html.escape(record.repro)}\n{html.escape(exact_line(campaign_dir, record))}</pre>",
        "</body></html>",
    ]
    return write_file(target / f"{record.run_id}.html", "\n".join(body).encode())
