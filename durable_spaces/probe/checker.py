"""Each step's class, from the workspace and what the model was shown.

Effects are counted in the workspace: step k's lines in log.txt (a shell step), its text in
notes.txt (a write or an edit). A shell step's effect line names the answer that asked for
it (``a<n>``, task.py), and ``late`` when a killed attempt's process made it after the kill
(gates.py). What the model was shown is read from the requests the model answered only (a
request cut off or held at a kill was never answered: the harness did not learn what the
model would have made of it), in order, with shown.py's rules: the first answered request
that shows anything about step k shows its ``output`` (the tool's own result), the
harness's ``reported`` interruption (the recipe's ``[report]``), an ``unverified`` result
(neither: a report in other words or a made-up success, which evidence cannot tell apart),
or nothing.

The model asks for a step again only when it has not seen it done; a second call that
follows a request showing the step (an unverified result) is the model's own choice and
begins a new episode, while one that follows a request showing nothing of it (the harness
lost the call and asked again) continues the episode. A step run twice in one episode, as
the answers its effects name tell (without names, the per-step ids: more effects than
episodes), is a duplicate: the harness ran a call the model did not ask for again.

The classes, first match wins:

- ``orphan``: an effect made after the kill by a process of a killed attempt, and not
  adopted: a harness that reattaches to its command after a restart shows the model that
  command's output (printed after its effect), and the step is then ``once``;
- ``duplicate``: the harness ran one of the model's calls twice or more;
- ``reported``: first shown the harness's report of an interruption;
- ``unverified``: first shown a result that is neither the tool's own nor the harness's
  report: a report in words the recipe did not declare, or a made-up success;
- ``once``: first shown its own output, the effect there;
- ``phantom``: shown its own output with no effect in the workspace (the output of a
  command that never ran; a file tool's usual answer for a write that never happened);
- ``lost``: the model never shown anything of the step in a run that finished (with no
  effect: the step silently dropped; with it: the model never learned of it).

A step of a run that did not finish (``stuck``, a run's own outcome) whose result the
model never saw is ``unfinished`` and not counted: the run's ``stuck`` says it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from durable_spaces.errors import BadFileError
from durable_spaces.host.bounded import open_file
from durable_spaces.probe.shown import StepView, calls_in, content_text, normalize, view
from durable_spaces.probe.task import LOG, NOTES, Step

__all__ = ["CLASSES", "SHOWN", "StepResult", "baseline_of", "check", "classify"]

CLASSES = ("once", "duplicate", "lost", "phantom", "reported", "unverified", "orphan")
SHOWN = ("output", "reported", "unverified", "none")
#: The most of a workspace file the checker reads.
MAX_READ = 4 << 20
_TAG = re.compile(r"a(\d{1,7})")


@dataclass(frozen=True)
class StepResult:
    step: int
    kind: str
    effects: int
    late: int
    shown: str  # one of SHOWN
    cls: str  # one of CLASSES, or unfinished
    asks: int = 1  # the model's calls for the step
    episodes: int = 1  # of them, the first and each the model chose to make again
    outside: int = -1  # its effects at the effect server (effect_server.py); -1: none asked

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> StepResult:
        shown = str(d["shown"])
        if shown not in SHOWN:
            raise ValueError(f"unknown shown {shown!r}")
        return StepResult(int(d["step"]), str(d["kind"]), int(d["effects"]), int(d["late"]),
                          shown, str(d["cls"]), int(d.get("asks", 1)),
                          int(d.get("episodes", 1)), int(d.get("outside", -1)))  # fmt: skip


def _read(path: Path) -> str:
    try:  # the harness's own file: a FIFO or a device there is no text, never waited on
        with os.fdopen(open_file(path), "rb") as f:
            return f.read(MAX_READ).decode("utf-8", "replace")
    except (FileNotFoundError, NotADirectoryError, BadFileError):
        return ""


def classify(effects: int, late: int, shown: str, finished: bool, duplicate: bool = False) -> str:
    if late and not (effects == 1 and shown == "output"):
        return "orphan"
    if duplicate or (effects >= 2 and shown == "output"):
        return "duplicate"
    if shown in ("reported", "unverified"):
        return shown
    if shown == "output":
        return "once" if effects else "phantom"
    return "lost" if finished else "unfinished"


def _effects(step: Step, log_lines: Sequence[str], notes: str) -> tuple[dict[int, int], int, int]:
    """Step's effects: per answer that named itself, the unnamed count, and the late."""
    if not step.shell:
        return {}, notes.count(step.effect_line), 0
    named: dict[int, int] = {}
    unnamed = late = 0
    for line in log_lines:
        if line != step.effect_line and not line.startswith(step.effect_line + " "):
            continue
        words = line[len(step.effect_line) :].split()
        late += "late" in words
        tag = next((int(m.group(1)) for w in words if (m := _TAG.fullmatch(w))), None)
        if tag is None:
            unnamed += 1
        else:
            named[tag] = named.get(tag, 0) + 1
    return named, unnamed, late


def _issued(requests: Sequence[dict[str, Any]]) -> dict[str, int]:
    return {str(r["call_id"]): int(r["step"]) for r in requests
            if r.get("call_id") and isinstance(r.get("step"), int)}  # fmt: skip


def baseline_of(steps: Sequence[Step], requests: Sequence[dict[str, Any]],
                swaps: Mapping[str, str]) -> dict[int, str]:  # fmt: skip
    """What each file step's tool answered in a run (the uninterrupted one), normalized:
    the evidence a later run's result of the same step is that tool's own (shown.py)."""
    issued = _issued(requests)
    nonce = steps[0].nonce if steps else ""
    out: dict[int, str] = {}
    for r in requests:
        body = r.get("body")
        msgs = body.get("messages") if isinstance(body, dict) else None
        if not r.get("answered") or not isinstance(msgs, list):
            continue
        ids = calls_in(msgs, nonce, issued)
        for m in msgs:
            if isinstance(m, dict) and m.get("role") == "tool":
                k = ids.get(str(m.get("tool_call_id")))
                if k is not None and k not in out and not steps[k - 1].shell:
                    text = normalize(content_text(m.get("content")), swaps)
                    if text:
                        out[k] = text
    return out


def check(steps: Sequence[Step], workdir: Path, requests: Sequence[dict[str, Any]],
          finished: bool, report: re.Pattern[str] | None = None,
          baseline: Mapping[int, str] | None = None,
          swaps: Mapping[str, str] | None = None,
          outside: Mapping[str, int] | None = None) -> list[StepResult]:  # fmt: skip
    """Every step the model asked for (or that left an effect), classed; ``outside``, the
    effect server's count per step token (``effect_server.count``) when the steps called
    it: a shell step counted there more often than the model's episodes of it is a
    duplicate, and one the model was shown done that never reached it is lost."""
    log_lines = _read(workdir / LOG).splitlines()
    notes = _read(workdir / NOTES)
    issued = _issued(requests)
    answered = [r for r in requests if r.get("answered")]
    views: list[tuple[dict[str, Any], dict[int, StepView]]] = [
        (r, view(r.get("body"), steps, issued, report, baseline, swaps or {})) for r in answered
    ]
    out = []
    for s in steps:
        named, unnamed, late = _effects(s, log_lines, notes)
        shown = next((v[s.k].shown for _, v in views if s.k in v), "none")
        # the model's calls for the step, each opening an episode when it chose to ask
        # again (the request showed the step: an unverified result)
        episode_of: dict[int, int] = {}
        episodes = 0
        for r, v in views:
            if r.get("step") == s.k and r.get("call_id"):
                if episodes == 0 or s.k in v:
                    episodes += 1
                episode_of[int(r["n"])] = episodes
        per: dict[int, int] = {}
        for n, c in named.items():
            if n in episode_of:
                per[episode_of[n]] = per.get(episode_of[n], 0) + c
            else:
                unnamed += c
        effects = sum(named.values()) + unnamed
        dup = any(c >= 2 for c in per.values()) or sum(per.values()) + unnamed > max(episodes, 1)
        there = -1 if outside is None or not s.shell else outside.get(s.token, 0)
        cls = classify(effects, late, shown, finished, dup or there > max(episodes, 1))
        if cls == "once" and there == 0:
            cls = "lost"  # the model was shown it done; the outside service never had it
        if cls == "unfinished":
            continue  # the run's own outcome (stuck) says why
        asks = len(episode_of)
        out.append(StepResult(s.k, s.kind, effects, late, shown, cls, asks, episodes, there))
    return out
