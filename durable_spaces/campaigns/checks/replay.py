"""``same_as_uninterrupted``: every committed tool call is the one the model asks for.

The scripted model is a pure function of the committed transcript: its call for step n
(n = the tool results committed before it, interrupted ones included) depends only on
the workspace the ``ok`` results before it imply. So the checker replays it entry by
entry, feeding it what its own interpreter (``workload.apply``) implies, and requires
each committed call (id, tool, arguments) to be exactly the model's, and no call after
the script's last step. A harness that re-asked the model with a different transcript,
lost a result, or committed a call twice shows up here as ``unexpected_call``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from durable_spaces.campaigns.checks.verdict import Anomaly, Verdict, anomaly, judge, unknown
from durable_spaces.campaigns.checks.workload import apply
from durable_spaces.harness.models import ScriptedModel

if TYPE_CHECKING:
    from durable_spaces.campaigns.checks.inputs import Inputs


def _show(tc: dict[str, Any]) -> str:
    return json.dumps(tc, sort_keys=True)[:160]


def same_as_uninterrupted(inputs: Inputs) -> Verdict:
    w = inputs.workload
    if w is None:
        return unknown("no workload parameters to replay the model with")
    model = ScriptedModel(
        w.seed, w.calls, files=w.files, sleep=w.sleep, server=w.server, gate=w.gate
    )
    history = inputs.history
    files: dict[str, str] = {}
    step = interrupted = asked = 0
    answered = False
    out: list[Anomaly] = []
    for e in history.entries:
        if e.kind == "tool_result":
            step += 1
            interrupted += e.data.get("status") == "interrupted"
            tc = history.calls.get(str(e.data.get("call_id")))
            if e.data.get("status") == "ok" and tc is not None:
                apply(files, str(tc.get("name")), tc.get("args") or {})
            continue
        if e.kind != "assistant":
            continue
        calls = [tc for tc in e.data.get("tool_calls") or [] if isinstance(tc, dict)]
        if not calls:
            if step < w.calls:
                detail = f"answered {e.data.get('content')!r} at step {step} of {w.calls}"
                out.append(anomaly("unexpected_call", detail, witness=[e.seq]))
            answered = True
            continue
        for tc in calls:
            asked += 1
            cid = str(tc.get("id"))
            if answered or step >= w.calls:
                detail = f"call at step {step}, after the script's {w.calls} steps: {_show(tc)}"
                out.append(anomaly("unexpected_call", detail, witness=[cid, e.seq]))
                continue
            want = model.call(step, dict(files)).to_json()
            if tc != want:
                detail = f"step {step} committed {_show(tc)}; the model asks for {_show(want)}"
                out.append(anomaly("unexpected_call", detail, witness=[cid, e.seq]))
    return judge(
        out, f"{asked} calls as the model asks ({interrupted} interrupted)", verified=asked
    )
