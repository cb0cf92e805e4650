"""What one request showed the model about each step: the evidence both the scripted model
(model_server.py, deciding its next answer) and the checker (checker.py, classing a step)
read, one function so the two never disagree.

A result is the tool's own only when it carries what only the tool's run could print: a
shell step's output line ``O <token>`` (its command prints it after its effect and never
spells it: task.py). A file tool's result can carry nothing of the kind (a write tool
answers "wrote 31 bytes"), so its evidence is weaker and said so: the text the same tool
answered for the same step in the uninterrupted run (``baseline``, with the run's own
nonce, directory and call ids put back), which a harness making up a result rarely writes
word for word. Words are never evidence: a result that is not the tool's own is a report
of an interruption or a made-up success, and only the recipe's ``[report]`` (the
harness's own words for "interrupted", declared by whoever wrote the recipe) tells the two
apart.

Where a request shows a step does not matter: a tool message answering one of the step's
calls (its id, or a call whose arguments carry the step's token), or any other message (a
user message summarising the calls of a harness that resumed with a fresh conversation).
In such a message, the text from one mention of a step (its token, or its command's
``p<nonce> s<k>`` pieces) to the mention of another is about that step.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from durable_spaces.probe.task import Step

__all__ = ["StepView", "calls_in", "content_text", "normalize", "view"]

#: The ids of the older per-step scheme (``--call-ids per-step``).
_STEP_ID = re.compile(r"call_([0-9a-f]{8})_(\d{1,4})")


def content_text(content: Any) -> str:
    """A message's content as text (a string, or a list of text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else json.dumps(content)


def _mention(nonce: str) -> re.Pattern[str]:
    # the token (``p<nonce>s<k>``) or the command's pieces (``p<nonce>' 's<k>``)
    return re.compile(rf"p{nonce}\W{{0,8}}s(\d{{1,4}})(?!\d)")


def calls_in(messages: Sequence[Any], nonce: str, issued: Mapping[str, int]) -> dict[str, int]:
    """The request's tool calls of this run's steps: call id -> step. ``issued`` maps the
    ids the scripted model gave to their steps; an id of the per-step scheme names its
    step; a call whose id the harness rewrote is known by the token in its arguments."""
    token = _mention(nonce)
    out: dict[str, int] = {}
    for m in messages:
        if not isinstance(m, dict) or m.get("role") != "assistant":
            continue
        for c in m.get("tool_calls") or ():
            if not isinstance(c, dict):
                continue
            cid = str(c.get("id", ""))
            if cid in issued:
                out[cid] = issued[cid]
                continue
            hit = _STEP_ID.fullmatch(cid)
            if hit and hit.group(1) == nonce:
                out[cid] = int(hit.group(2))
                continue
            fn = c.get("function")
            found = token.search(str(fn.get("arguments", ""))) if isinstance(fn, dict) else None
            if found:
                out[cid] = int(found.group(1))
    return out


def normalize(text: str, swaps: Mapping[str, str]) -> str:
    """``text`` with each of ``swaps``' keys (a run's nonce, directory, call ids) replaced
    by its placeholder, so one run's result can be held against another's."""
    for old in sorted(swaps, key=len, reverse=True):
        if old:
            text = text.replace(old, swaps[old])
    return text.strip()


@dataclass
class StepView:
    """What one request showed about one step."""

    output: bool = False  # the tool's own result (the output line; a file tool's baseline)
    reported: bool = False  # the recipe's report, about this step
    result: bool = False  # anything about the step: a result of one of its calls, a mention

    @property
    def shown(self) -> str:
        """``output``, ``reported``, ``unverified`` (a result that is neither) or ``none``."""
        if self.output:
            return "output"
        if self.reported:
            return "reported"
        return "unverified" if self.result else "none"


def _segments(text: str, mention: re.Pattern[str]) -> list[tuple[int, str]]:
    """The parts of ``text`` about each step: from a mention to the next of another step."""
    hits = list(mention.finditer(text))
    out: list[tuple[int, str]] = []
    for i, h in enumerate(hits):
        k = int(h.group(1))
        if out and out[-1][0] == k:
            continue
        end = next((x.start() for x in hits[i + 1 :] if int(x.group(1)) != k), len(text))
        out.append((k, text[h.start() : end]))
    return out


def view(
    body: Any,
    steps: Sequence[Step],
    issued: Mapping[str, int],
    report: re.Pattern[str] | None,
    baseline: Mapping[int, str] | None,
    swaps: Mapping[str, str],
) -> dict[int, StepView]:
    """What request ``body`` showed about each step (steps it shows nothing of are left
    out). ``baseline``: a file step's result in the uninterrupted run, normalized; None
    in the uninterrupted run itself, where any result of a file step is taken as its own
    (nothing was cut short there)."""
    msgs = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(msgs, list) or not steps:
        return {}
    by_k = {s.k: s for s in steps}
    nonce = steps[0].nonce
    mention = _mention(nonce)
    ids = calls_in(msgs, nonce, issued)
    out: dict[int, StepView] = {}

    def about(k: int, text: str, tool_result: bool) -> None:
        s = by_k.get(k)
        if s is None:
            return
        v = out.setdefault(k, StepView())
        v.result = True
        if s.shell:
            v.output = v.output or s.output_line in text
        elif baseline is None:
            v.output = v.output or tool_result
        else:
            base = baseline.get(k) or ""
            v.output = v.output or (bool(base) and base in normalize(text, swaps))
        if report is not None and report.search(text):
            v.reported = True

    for m in msgs:
        if not isinstance(m, dict) or m.get("role") == "assistant":
            continue
        text = content_text(m.get("content"))
        k = ids.get(str(m.get("tool_call_id"))) if m.get("role") == "tool" else None
        if k is not None:
            about(k, text, True)
        for s in steps:  # a step's output shown anywhere is shown
            if s.k != k and s.shell and s.output_line in text:
                about(s.k, s.output_line, False)
        if k is None:
            for k2, part in _segments(text, mention):
                about(k2, part, False)
    return out
