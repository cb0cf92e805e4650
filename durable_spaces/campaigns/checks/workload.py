"""The checker's own interpreter of the scripted workload's effects.

The workload (``ScriptedModel`` in ``durable_spaces/harness/models.py``) makes three
kinds of calls, each recognisable from its arguments alone:

- ``write {path, content}``: the file becomes ``content``;
- ``edit {path, old_text, new_text}``: the one occurrence of ``old_text`` (a whole line)
  becomes ``new_text``, which is that line followed by a new token line, so an edit
  applied twice leaves its token line twice;
- ``bash "[sleep S && ][while [ ! -e 'GATE' ]; do sleep 0.01; done && ]printf '%s\\n'
  'TOKEN' >> PATH"``: appends a token line (once the gate file exists, when it has one);
- the server start (a command naming ``/tmp/ds-server.pid``): no workspace effect; its
  result reports the server's pid (``ds-server pid N``, read by ``server_started``).

Every line the workload writes carries a token unique to its step, so ``origin`` can
name the call behind any line found in the workspace. A write applied twice in a row is
indistinguishable by construction (the file is the same after one application or two);
a *late* re-application, after a later call changed the file, brings back an earlier
version, which ``effects`` reports.

This interpreter is written independently of the model's ``implied_workspace`` on
purpose; the replay check (``replay``) feeds its result to the model, so the two must
agree on every committed transcript or the run fails.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from durable_spaces.campaigns.checks.history import History

_APPEND = re.compile(
    r"^(?:sleep [0-9.]+ && )?(?:while \[ ! -e '[^'\n]*' \]; do sleep 0\.01; done && )?"
    r"printf '%s\\n' (?P<arg>'[^'\n]*') >> (?P<path>[A-Za-z0-9_.-]+)$"
)
SERVER_PID_FILE = "/tmp/ds-server.pid"
#: The server's heartbeat: the time (``date +%s``) it last wrote, every 0.2 s.
SERVER_BEAT_FILE = "/tmp/ds-server.beat"
_SERVER_STARTED = re.compile(r"ds-server pid (\d+)")


def is_server_command(command: str) -> bool:
    """The scripted "server" start (a heartbeat loop that writes only under /tmp)."""
    return SERVER_PID_FILE in command and ">> " not in command


def server_started(history: History) -> int | None:
    """The pid the server's start reported in its committed result (None: no result
    reports one)."""
    for r in history.results:
        content = r.get("content")
        if isinstance(content, str) and "ds-server pid" in content:
            m = _SERVER_STARTED.search(content)
            return int(m.group(1)) if m else None
    return None


def parse_append(command: str) -> tuple[str, str] | None:
    """(path, line) a scripted bash command appends; None if it is not one."""
    m = _APPEND.match(command)
    if m is None:
        return None
    return m.group("path"), shlex.split(m.group("arg"))[0]


def _text(args: Mapping[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str):
        raise ValueError(f"argument {key!r} is not a string")
    return value


def apply(files: dict[str, str], name: str, args: Mapping[str, Any]) -> str | None:
    """Apply one call that succeeded to ``files``; a problem (it cannot apply) or None."""
    try:
        if name == "write":
            files[_text(args, "path")] = _text(args, "content")
        elif name == "edit":
            path, old, new = _text(args, "path"), _text(args, "old_text"), _text(args, "new_text")
            before = files.get(path)
            if before is None or not old or before.count(old) != 1:
                return f"edit of {path} does not apply to the implied file"
            files[path] = before.replace(old, new, 1)
        elif name == "bash":
            command = _text(args, "command")
            if is_server_command(command):
                return None
            parsed = parse_append(command)
            if parsed is None:
                return f"bash {command[:80]!r} is not an appending command"
            path, line = parsed
            files[path] = files.get(path, "") + line + "\n"
        else:
            return f"tool {name!r} is not part of the workload"
    except ValueError as e:
        return f"{name}: {e}"
    return None


def touched(name: str, args: Mapping[str, Any]) -> str | None:
    """The path a call changes (None: none, or not a workload call)."""
    if name in ("write", "edit") and isinstance(args.get("path"), str):
        return str(args["path"])
    if name == "bash" and isinstance(args.get("command"), str):
        parsed = parse_append(args["command"])
        return parsed[0] if parsed else None
    return None


def introduced(name: str, args: Mapping[str, Any]) -> list[str]:
    """The lines a call brings into a file (what makes its effect visible)."""
    if name == "write" and isinstance(args.get("content"), str):
        return args["content"].splitlines()
    if name == "edit" and isinstance(args.get("new_text"), str):
        old = set(str(args.get("old_text", "")).splitlines())
        return [ln for ln in args["new_text"].splitlines() if ln not in old]
    if name == "bash" and isinstance(args.get("command"), str):
        parsed = parse_append(args["command"])
        return [parsed[1]] if parsed else []
    return []


@dataclass(frozen=True)
class Version:
    """A file's content right after one committed call changed it."""

    call: str
    tool: str  # write | edit | bash
    content: str


@dataclass
class Implied:
    """What the committed transcript implies, with the provenance the checks need."""

    files: dict[str, str] = field(default_factory=dict)
    versions: dict[str, list[Version]] = field(default_factory=dict)
    #: line -> the call that introduced it (every call of the transcript, ok or not)
    origin: dict[str, str] = field(default_factory=dict)
    committed: list[str] = field(default_factory=list)  # ok calls, in result order
    problems: list[str] = field(default_factory=list)

    def calls_on(self, path: str) -> list[str]:
        return [v.call for v in self.versions.get(path, [])]


def interpret(history: History) -> Implied:
    """Apply every ``ok`` result's call once, in commit order."""
    out = Implied()
    for cid, tc in history.calls.items():
        for line in introduced(str(tc.get("name")), tc.get("args") or {}):
            out.origin.setdefault(line, cid)
    for r in history.results:
        if r.get("status") != "ok":
            continue
        cid = str(r.get("call_id"))
        found = history.calls.get(cid)
        if found is None:
            out.problems.append(f"result for unknown call {cid}")
            continue
        name, args = str(found.get("name")), found.get("args") or {}
        problem = apply(out.files, name, args)
        if problem is not None:
            out.problems.append(f"{cid}: {problem}")
            continue
        out.committed.append(cid)
        path = touched(name, args)
        if path is not None:
            out.versions.setdefault(path, []).append(Version(cid, name, out.files[path]))
    return out
