"""A fast harness for bench/probe.py: a chat loop over urllib (no SDK to import), its
history in a JSON file written after each step; on resume an unfinished call is reported
as interrupted. Run as a script by the bench's recipe."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}}}}]  # fmt: skip


def main() -> int:
    url, state, prompt = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    hist = state / "history.json"
    msgs: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    if hist.exists():
        msgs = json.loads(hist.read_text())
    while True:
        last = msgs[-1]
        for call in last.get("tool_calls") or [] if last["role"] == "assistant" else []:
            cmd = json.loads(call["function"]["arguments"])["command"]
            p = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True)
            msgs.append({"role": "tool", "tool_call_id": call["id"], "content": p.stdout})
        hist.write_text(json.dumps(msgs))
        body = json.dumps({"model": "m", "messages": msgs, "tools": TOOLS}).encode()
        req = urllib.request.Request(f"{url}/chat/completions", body,
                                     {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req) as r:
            msg = json.loads(r.read())["choices"][0]["message"]
        msgs.append(msg)
        hist.write_text(json.dumps(msgs))
        if not msg.get("tool_calls"):
            return 0


if __name__ == "__main__":
    sys.exit(main())
