"""Each step's class, from the workspace and the requests the model received.

Effects are counted in the workspace: step k's lines in log.txt (a shell step), its text in
notes.txt (a write or an edit); an effect line tagged ``late`` was made by a killed
attempt's process after the kill (gates.py). What the model was shown for step k is the
first request that carries a tool message for step k's call: its output (the step's token),
an error or interruption (``REPORT_WORDS``), anything else (a result it could not have had),
or nothing (no request ever carried one).

The classes, first match wins:

- ``orphan``: an effect made after the kill by a process of a killed attempt, and not
  adopted: a harness that reattaches to its command after a restart shows the model that
  command's output (printed after its effect), and the step is then ``once``;
- ``duplicate``: the effect twice or more;
- ``reported``: the model was told of an error or an interruption;
- ``once``: the effect once and the model shown its output;
- ``phantom``: the model was shown a success it could not have had (a made-up result,
  or the step's output with no effect in the workspace);
- ``lost``: the model never shown a result for the step in a run that finished (with no
  effect: the step silently dropped; with it: the model never learned of it).

A step of a run that did not finish (``stuck``, a run's own outcome) whose result the
model never saw is ``unfinished`` and not counted: the run's ``stuck`` says it. A write
tool's result names no token, so a write or an edit shown something without error words
counts as shown its output.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from durable_spaces.errors import BadFileError
from durable_spaces.host.bounded import open_file
from durable_spaces.probe.model_server import calls_in, content_text
from durable_spaces.probe.task import LOG, NOTES, Step

__all__ = ["CLASSES", "REPORT_WORDS", "StepResult", "check", "shown_as"]

CLASSES = ("once", "duplicate", "lost", "phantom", "reported", "orphan")
#: Words that tell the model its call failed or was cut short.
REPORT_WORDS = re.compile(
    r"\b(errors?|interrupt\w*|kill\w*|abort\w*|fail\w*|cancel\w*|timed out|timeout|"
    r"crash\w*|exception|no result|not run|unknown|lost|denied|not found|no such|"
    r"exit (?:code|status) -?[1-9]\d*|signal)\b",
    re.IGNORECASE,
)
#: The most of a workspace file the checker reads.
MAX_READ = 4 << 20


@dataclass(frozen=True)
class StepResult:
    step: int
    kind: str
    effects: int
    late: int
    shown: str  # output | reported | fabricated | none
    cls: str  # one of CLASSES, or unfinished

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> StepResult:
        return StepResult(int(d["step"]), str(d["kind"]), int(d["effects"]), int(d["late"]),
                          str(d["shown"]), str(d["cls"]))  # fmt: skip


def _read(path: Path) -> str:
    try:  # the harness's own file: a FIFO or a device there is no text, never waited on
        with os.fdopen(open_file(path), "rb") as f:
            return f.read(MAX_READ).decode("utf-8", "replace")
    except (FileNotFoundError, NotADirectoryError, BadFileError):
        return ""


def shown_as(step: Step, text: str) -> str:
    if step.shell and step.output_line in text:
        return "output"
    if REPORT_WORDS.search(text):
        return "reported"
    return "fabricated" if step.shell else "output"


def first_result(step: Step, requests: Iterable[dict[str, Any]]) -> str | None:
    """The text of the first tool message for ``step``'s call, in request order."""
    for r in requests:
        body = r.get("body")
        msgs = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(msgs, list):
            continue
        ids = {cid for cid, k in calls_in(msgs, step.nonce).items() if k == step.k}
        for m in msgs:
            if isinstance(m, dict) and m.get("role") == "tool" and m.get("tool_call_id") in ids:
                return content_text(m.get("content"))
    return None


def classify(effects: int, late: int, shown: str, finished: bool) -> str:
    if late and not (effects == 1 and shown == "output"):
        return "orphan"
    if effects >= 2:
        return "duplicate"
    if shown == "reported":
        return "reported"
    if shown == "output":
        return "once" if effects == 1 else "phantom"
    if shown == "fabricated":
        return "phantom"
    return "lost" if finished else "unfinished"


def check(steps: Sequence[Step], workdir: Path, requests: Sequence[dict[str, Any]],
          finished: bool) -> list[StepResult]:  # fmt: skip
    """Every step the model asked for (or that left an effect), classed."""
    log_lines = _read(workdir / LOG).splitlines()
    notes = _read(workdir / NOTES)
    out = []
    for s in steps:
        if s.shell:
            mine = [x for x in log_lines if x == s.effect_line or x.startswith(s.effect_line + " ")]
            effects, late = len(mine), sum(1 for x in mine if x.endswith(" late"))
        else:
            effects, late = notes.count(s.effect_line), 0
        result = first_result(s, requests)
        shown = "none" if result is None else shown_as(s, result)
        cls = classify(effects, late, shown, finished)
        if cls == "unfinished":
            continue  # the run's own outcome (stuck) says why
        out.append(StepResult(s.k, s.kind, effects, late, shown, cls))
    return out
