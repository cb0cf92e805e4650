"""A small agent harness (standard library only, urllib and streaming SSE) for the probe's
tests, which writes its transcript lazily: the results of a turn's tool calls and the
model's next answer reach the transcript together, only once that answer has arrived. A
crash while the next request is out (or its answer under way) loses what the calls
printed; on resume a call the transcript holds without a result is answered "the call was
cut off before it returned" and never run again (the calls it began are kept in
began.txt, synced before each runs).

Usage: python lazyagent.py --model-url URL --state DIR [--prompt P] [--resume]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "shell",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
CUT = "the call was cut off before it returned"


def durable_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def ask(url: str, messages: list[dict]) -> dict:
    """One streamed answer, put together; an answer cut short raises."""
    req = urllib.request.Request(
        url + "/chat/completions",
        method="POST",
        data=json.dumps(
            {"model": "m", "messages": messages, "tools": TOOLS, "stream": True}
        ).encode(),
        headers={"content-type": "application/json"},
    )
    text, calls, done = "", {}, False
    with urllib.request.urlopen(req, timeout=60) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            for ch in ev.get("choices") or ():
                done = done or ch.get("finish_reason") is not None
                d = ch.get("delta") or {}
                text += d.get("content") or ""
                for tc in d.get("tool_calls") or ():
                    c = calls.setdefault(
                        tc["index"],
                        {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                    )
                    c["id"] = tc.get("id") or c["id"]
                    fn = tc.get("function") or {}
                    c["function"]["name"] += fn.get("name") or ""
                    c["function"]["arguments"] += fn.get("arguments") or ""
    if not done:
        raise RuntimeError("the answer was cut short")
    msg: dict = {"role": "assistant", "content": text or None}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-url", required=True)
    ap.add_argument("--state", required=True, type=Path)
    ap.add_argument("--prompt", default="go")
    ap.add_argument("--resume", action="store_true")
    a = ap.parse_args()
    transcript = a.state / "transcript.json"
    began_file = a.state / "began.txt"
    messages = (
        json.loads(transcript.read_text())
        if transcript.exists()
        else [{"role": "user", "content": a.prompt}]
    )
    began = set(began_file.read_text().split()) if began_file.exists() else set()
    last = messages[-1]
    pending = last.get("tool_calls") or [] if last["role"] == "assistant" else []
    while True:
        unsaved = []
        for c in pending:
            if c["id"] in began:
                out = CUT
            else:
                began.add(c["id"])
                durable_write(began_file, "\n".join(sorted(began)) + "\n")
                cmd = json.loads(c["function"]["arguments"])["command"]
                p = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True)
                out = p.stdout + p.stderr
            unsaved.append({"role": "tool", "tool_call_id": c["id"], "content": out})
        answer = ask(a.model_url, messages + unsaved)
        messages += [*unsaved, answer]
        durable_write(transcript, json.dumps(messages))
        pending = answer.get("tool_calls") or []
        if not pending:
            return 0


if __name__ == "__main__":
    sys.exit(main())
