"""The checker: does the Space's workspace equal what the committed log implies?

Jepsen's shape: each check is a function of the run's history (here, the raw commits of
the log and a snapshot of the workspace) returning ``{"valid": True|False|None,
"detail": ...}``; ``compose`` runs them all and merges false > unknown > true; a check
that raises counts as unknown instead of crashing the analysis.

Independence matters: the expected workspace is computed from the transcript's tool calls
and results alone, with an interpreter written here, not from the adapter's
``cua.space`` bookkeeping (which is what is under test). Only ``image_equals_workspace``
reads the adapter's image, because that is exactly its claim.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_spaces.adapter.image import read_image
from durable_spaces.adapter.log import Commit
from durable_spaces.adapter.space import Space

Verdict = dict[str, Any]

# printf '%s\n' 'TOKEN' >> FILE, optionally after `sleep S && `
_APPEND = re.compile(r"^(?:sleep [0-9.]+ && )?printf '%s\\n' (?P<arg>'[^']*') >> (?P<path>\S+)$")


@dataclass
class History:
    """What the log committed, decoded for checking."""

    commits: list[Commit]
    conversation: str | None = None
    calls: dict[str, dict[str, Any]] = field(default_factory=dict)  # call id -> tool call
    results: list[dict[str, Any]] = field(default_factory=list)  # tool_result data, in order
    docs: dict[str, Any] = field(default_factory=dict)  # latest value per doc name (root)

    @staticmethod
    def from_commits(commits: list[Commit]) -> History:
        h = History(commits)
        for c in commits:
            for op in c.ops:
                kind = op.get("op")
                if (
                    kind == "conversation"
                    and op.get("parent_id") is None
                    and h.conversation is None
                ):
                    h.conversation = op["id"]
                elif kind == "entry" and op.get("conversation_id") == h.conversation:
                    data = op.get("data", {})
                    if op["kind"] == "assistant":
                        for tc in data.get("tool_calls", []):
                            h.calls[tc["id"]] = tc
                    elif op["kind"] == "tool_result":
                        h.results.append(data)
                elif kind == "doc" and op.get("conversation_id") == h.conversation:
                    h.docs[op["name"]] = op.get("value")
        return h


def is_server_command(command: str) -> bool:
    """The scripted "server" start (a heartbeat loop that writes only under /tmp)."""
    return "/tmp/ds-server.pid" in command and ">> " not in command


def interpret_append(command: str) -> tuple[str, str] | None:
    """(path, line) appended by a scripted bash command; None if it is not one."""
    m = _APPEND.match(command.strip())
    if m is None:
        return None
    return m.group("path"), shlex.split(m.group("arg"))[0]


def expected_workspace(history: History) -> tuple[dict[str, str], list[str]]:
    """Apply every ``ok`` result's call once, in commit order. Returns the files and the
    problems met (a call this interpreter cannot apply)."""
    files: dict[str, str] = {}
    problems: list[str] = []
    for r in history.results:
        if r.get("status") != "ok":
            continue
        tc = history.calls.get(r.get("call_id", ""))
        if tc is None:
            problems.append(f"result for unknown call {r.get('call_id')}")
            continue
        args = tc.get("args", {})
        name = tc.get("name")
        if name == "write":
            files[args["path"]] = args["content"]
        elif name == "edit":
            before = files.get(args["path"])
            if before is None or before.count(args["old_text"]) != 1:
                problems.append(f"edit {tc['id']} does not apply to the implied file")
                continue
            files[args["path"]] = before.replace(args["old_text"], args["new_text"], 1)
        elif name == "bash":
            if is_server_command(args.get("command", "")):
                continue  # a process outside the workspace: no workspace effect
            parsed = interpret_append(args.get("command", ""))
            if parsed is None:
                problems.append(f"bash {tc['id']} is not an appending command")
                continue
            path, line = parsed
            files[path] = files.get(path, "") + line + "\n"
    return files, problems


# --- the checks -------------------------------------------------------------------------


def workspace_equals_log(history: History, workspace: Mapping[str, bytes]) -> Verdict:
    expected, problems = expected_workspace(history)
    if problems:
        return {"valid": None, "detail": "; ".join(problems)}
    got = {p: b.decode(errors="replace") for p, b in workspace.items()}
    if got == expected:
        return {"valid": True, "detail": f"{len(got)} files"}
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    differ = sorted(p for p in set(got) & set(expected) if got[p] != expected[p])
    detail = f"missing={missing} extra={extra} differ={differ}"
    if differ:
        p = differ[0]
        detail += f" first: expected {expected[p][-200:]!r} got {got[p][-200:]!r}"
    return {"valid": False, "detail": detail}


def exactly_once(history: History, workspace: Mapping[str, bytes]) -> Verdict:
    """Every appended token appears once, in the order its results were committed."""
    want: dict[str, list[str]] = {}
    for r in history.results:
        tc = history.calls.get(r.get("call_id", ""))
        if r.get("status") == "ok" and tc and tc.get("name") == "bash":
            parsed = interpret_append(tc["args"].get("command", ""))
            if parsed:
                want.setdefault(parsed[0], []).append(parsed[1])
    for path, lines in want.items():
        got = workspace.get(path, b"").decode(errors="replace").splitlines()
        dupes = sorted({x for x in got if got.count(x) > 1})
        if dupes:
            return {"valid": False, "detail": f"{path}: applied twice: {dupes}"}
        if got != lines:
            return {"valid": False, "detail": f"{path}: expected {lines} got {got}"}
    return {"valid": True, "detail": f"{sum(map(len, want.values()))} appends"}


def no_error_results(history: History, workspace: Mapping[str, bytes]) -> Verdict:
    bad = [r for r in history.results if r.get("status") not in ("ok", "interrupted")]
    if bad:
        return {
            "valid": False,
            "detail": f"{len(bad)} error results, first: {bad[0].get('content', '')[:200]!r}",
        }
    return {"valid": True, "detail": f"{len(history.results)} results"}


def no_stale_writes(history: History, workspace: Mapping[str, bytes]) -> Verdict:
    """Commits' epochs never go down: a stale driver's commit would."""
    high = 0
    for c in history.commits:
        if c.epoch is None:
            continue
        if c.epoch < high:
            return {"valid": False, "detail": f"commit {c.seq} by epoch {c.epoch} after {high}"}
        high = c.epoch
    return {"valid": True, "detail": f"highest epoch {high}"}


def image_equals_workspace(history: History, workspace: Mapping[str, bytes]) -> Verdict:
    """Transactional runs: the log's image equals the workspace (paths and content)."""
    mode = (history.docs.get("cua.space") or {}).get("mode")
    if mode != "transactional":
        return {"valid": True, "detail": f"not transactional (mode {mode})"}
    table = read_image(history.docs.get("cua.space.image"), history.docs.get)
    if set(table) != set(workspace):
        return {
            "valid": False,
            "detail": f"image paths {sorted(table)} != workspace {sorted(workspace)}",
        }
    for p, e in table.items():
        if e.kind == "file" and e.sha256 != hashlib.sha256(workspace[p]).hexdigest():
            return {"valid": False, "detail": f"{p}: image sha differs from workspace"}
    return {"valid": True, "detail": f"{len(table)} paths"}


def finished(history: History, workspace: Mapping[str, bytes]) -> Verdict:
    """The run reached its final answer (every scripted step has a result)."""
    done = any(
        op.get("op") == "submission" and op.get("state") == "done"
        for c in history.commits
        for op in c.ops
    )
    return {"valid": done, "detail": "submission done" if done else "submission not done"}


Check = Callable[[History, Mapping[str, bytes]], Verdict]

CHECKS: dict[str, Check] = {
    "workspace_equals_log": workspace_equals_log,
    "exactly_once": exactly_once,
    "no_error_results": no_error_results,
    "no_stale_writes": no_stale_writes,
    "image_equals_workspace": image_equals_workspace,
    "finished": finished,
}


def merge(verdicts: Mapping[str, Verdict]) -> bool | None:
    """false > unknown > true."""
    vals = [v.get("valid") for v in verdicts.values()]
    if any(v is False for v in vals):
        return False
    if any(v is None for v in vals):
        return None
    return True


def compose(
    checks: Mapping[str, Check],
) -> Callable[[History, Mapping[str, bytes]], dict[str, Verdict]]:
    def run(history: History, workspace: Mapping[str, bytes]) -> dict[str, Verdict]:
        out: dict[str, Verdict] = {}
        for name, check in checks.items():
            try:
                out[name] = check(history, workspace)
            except Exception as e:  # a broken check is unknown, not a crash
                out[name] = {"valid": None, "detail": f"check raised {type(e).__name__}: {e}"}
        return out

    return run


check_all = compose(CHECKS)


def decode_b64(text: str) -> bytes:
    return base64.b64decode(text)


async def snapshot_workspace(space: Space) -> dict[str, bytes]:
    """Every file of the workspace with its bytes (symlinks as ``-> target``)."""
    table = await space.scan(".")
    out: dict[str, bytes] = {}
    for path, entry in sorted(table.items()):
        if entry.kind == "symlink":
            out[path] = f"-> {entry.target}".encode()
        else:
            out[path] = await space.read_file(path)
    return out


def load_history(log_path: str) -> History:
    """Read a run's log without taking ownership (the checker is not a writer)."""
    from durable_spaces.adapter.log import SqliteStorage

    storage = SqliteStorage(log_path, exclusive=False)
    try:
        return History.from_commits(storage.load())
    finally:
        storage.close()
