"""A tiny agent harness for the probe's tests: a real OpenAI client loop with a journal.

Each recipe under this directory runs it with one ``--defect`` (or none):

- ``none``: journals each call's intent and its result (fsync; the new journal's name too,
  by an fsync of its directory) before the next request; on resume an unfinished call is
  reported to the model as interrupted, never run again.
- ``nosync``: as ``none``, but its journal is never fsynced: a power loss takes it.
- ``rerun``: on resume an unfinished call runs again.
- ``phantom``: records a success ("ok") before running a call, so a resume believes it.
- ``detached``: as ``none``, but its tools run in a session of their own (setsid).
- ``hang``: never finishes (sleeps after its first answer).
- ``crash``: fails at start.
- ``noresult``: never sends a tool's result, so the model is never told (a made-up request).
- ``loop``: never calls the model at all and exits 0.
- ``flood``: prints a lot, then behaves as ``none``.
- ``responses``: asks the Responses API, which the scripted model does not answer.

``--hold DIR`` (any defect): a resumed attempt of an unfinished run (not the probe's trial
of the resume command on a finished one) says so by a file ``DIR/held-<pid>`` and then
waits until it is killed, so a test knows a planned run is under way and stays so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from openai import OpenAI


def tools(file_tools: bool) -> list[dict]:
    out = [
        {
            "type": "function",
            "function": {
                "name": "bash",
                "description": "run a shell command",
                "parameters": {
                    "type": "object",
                    "properties": {"command": {"type": "string"}},
                    "required": ["command"],
                },
            },
        }
    ]
    if file_tools:
        out.append(
            {
                "type": "function",
                "function": {
                    "name": "write",
                    "description": "write a file",
                    "parameters": {
                        "type": "object",
                        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                    },
                },
            }
        )
        out.append(
            {
                "type": "function",
                "function": {
                    "name": "edit",
                    "description": "replace text in a file",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "path": {"type": "string"},
                            "old_text": {"type": "string"},
                            "new_text": {"type": "string"},
                        },
                    },
                },
            }
        )
    return out


class Journal:
    def __init__(self, path: Path, sync: bool) -> None:
        self.path = path
        self.sync = sync

    def add(self, event: dict) -> None:
        new = not self.path.exists()
        with self.path.open("a") as f:
            f.write(json.dumps(event) + "\n")
            f.flush()
            if self.sync:
                os.fsync(f.fileno())
        if new and self.sync:  # the journal's name is durable only once its directory is
            fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def events(self) -> list[dict]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                break  # a torn last line
        return out


def run_tool(name: str, args: dict, detached: bool) -> str:
    if name == "bash":
        p = subprocess.run(
            ["/bin/sh", "-c", args["command"]],
            capture_output=True,
            text=True,
            start_new_session=detached,
        )
        return p.stdout + p.stderr + (f"\n(exit code {p.returncode})" if p.returncode else "")
    if name == "write":
        Path(args["path"]).write_text(args["content"])
        return f"wrote {len(args['content'])} bytes"
    if name == "edit":
        path = Path(args["path"])
        text = path.read_text() if path.exists() else ""
        if args["old_text"] not in text:
            return "error: old_text not found"
        path.write_text(text.replace(args["old_text"], args["new_text"], 1))
        return "edited"
    return f"error: no tool {name}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-url", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--prompt", default="")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--defect", default="none")
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--file-tools", action="store_true")
    ap.add_argument("--tool-name", default="bash")
    ap.add_argument("--hold")
    a = ap.parse_args()
    if a.defect == "crash":
        print("fakeagent: cannot start: the defect is crash", file=sys.stderr)
        return 1
    if a.defect == "loop":
        return 0
    if a.defect == "flood":
        sys.stdout.write("x" * 100 + "\n" * 1)
        for _ in range(20000):
            sys.stdout.write("flooding the output " * 10 + "\n")
    journal = Journal(Path(a.state) / "journal.jsonl", sync=a.defect not in ("rerun", "nosync"))
    messages: list[dict] = []
    results: dict[str, str] = {}
    for ev in journal.events():
        if "message" in ev:
            messages.append(ev["message"])
        elif "result" in ev:
            results[ev["id"]] = ev["result"]
    finished = bool(messages) and messages[-1]["role"] == "assistant" and not (
        messages[-1].get("tool_calls")
    )
    if a.hold and a.resume and not finished:  # the probe's trial resume of a finished run
        (Path(a.hold) / f"held-{os.getpid()}").write_text("")  # passes: it is no planned run
        while True:
            time.sleep(3600)  # until the probe kills us: the test holds the gate
    if not messages:
        messages = [{"role": "user", "content": a.prompt or "go"}]
        for m in messages:
            journal.add({"message": m})
    # The calls of the last assistant message that have no result message yet.
    pending: list[dict] = []
    asked = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if asked:
        done = {m.get("tool_call_id") for m in messages[asked[-1] + 1 :]}
        pending = [c for c in messages[asked[-1]].get("tool_calls") or [] if c["id"] not in done]
    intents = {ev["intent"] for ev in journal.events() if "intent" in ev}
    offered = tools(a.file_tools)
    if a.tool_name != "bash":
        offered[0]["function"]["name"] = a.tool_name
    client = OpenAI(base_url=a.model_url, api_key="dummy", max_retries=0)
    if a.defect == "responses":
        client.responses.create(model="fake", input=a.prompt or "go")
        return 0
    while True:
        for call in pending:
            cid = call["id"]
            if cid in results:
                out = results[cid]  # phantom: the success it recorded before running
            elif cid in intents and a.defect in ("none", "detached", "flood", "nosync"):
                out = "interrupted: the call was cut short by a crash; it may or may not have run"
            else:
                journal.add({"intent": cid})
                if a.defect == "phantom":
                    journal.add({"id": cid, "result": "ok"})
                out = run_tool(
                    call["function"]["name"],
                    json.loads(call["function"]["arguments"]),
                    a.defect == "detached",
                )
            journal.add({"id": cid, "result": out})
            if a.defect == "noresult":
                out = "done"
            msg = {"role": "tool", "tool_call_id": cid, "content": out}
            messages.append(msg)
            journal.add({"message": msg})
        kw = {"model": "fake", "messages": messages, "tools": offered}
        if a.stream:
            content, calls, finished = "", {}, False
            for chunk in client.chat.completions.create(stream=True, **kw):
                if not chunk.choices:
                    continue
                finished = finished or chunk.choices[0].finish_reason is not None
                d = chunk.choices[0].delta
                content += d.content or ""
                for tc in d.tool_calls or []:
                    c = calls.setdefault(
                        tc.index,
                        {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                    )
                    c["id"] = tc.id or c["id"]
                    if tc.function:
                        c["function"]["name"] += tc.function.name or ""
                        c["function"]["arguments"] += tc.function.arguments or ""
            if not finished:  # the stream was cut: no answer, whatever came of it
                raise SystemExit("fakeagent: the model's answer was cut off")
            tool_calls = [calls[i] for i in sorted(calls)]
        else:
            r = client.chat.completions.create(**kw)
            m = r.choices[0].message
            content = m.content or ""
            tool_calls = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in m.tool_calls or []
            ]
        if a.defect == "hang":
            time.sleep(3600)
        msg = {"role": "assistant", "content": content or None}
        if tool_calls:
            msg["tool_calls"] = tool_calls
        messages.append(msg)
        journal.add({"message": msg})
        if not tool_calls:
            return 0
        pending = tool_calls


if __name__ == "__main__":
    sys.exit(main())
