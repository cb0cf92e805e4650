"""A harness's recipe: how the probe launches and resumes it, which tools it has, and how
it says that a call was interrupted.

A recipe is a ``recipe.toml`` (or a directory holding one); docs/probe.md describes its
fields. Everything is checked when it is loaded, so a bad recipe is one line before any
run starts: a missing or malformed field, an unknown ``{placeholder}``, an unreadable file,
a program of the recipe's own directory that is not there, a ``[report]`` that is not one
line or whose pattern does not compile or matches an empty text.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from durable_spaces.errors import BadFileError, ConfigError
from durable_spaces.host.bounded import load_toml

__all__ = [
    "PLACEHOLDERS", "FileTool", "Recipe", "ShellTool", "builtin_dir", "load", "program_error",
    "resolve",
]  # fmt: skip

#: The placeholders a recipe's commands and environment may use.
PLACEHOLDERS = ("model_url", "workdir", "state_dir", "run_id", "prompt", "recipe_dir", "python")
#: A recipe file is a few hundred bytes; a bigger one is not a recipe.
MAX_RECIPE_BYTES = 1 << 20
#: Attempts of one run (the launch and its resumes) when the recipe does not say.
DEFAULT_ATTEMPTS = 4

_FIELD = re.compile(r"\{([^{}]*)\}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_TOOL = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ShellTool:
    name: str
    argument: str


@dataclass(frozen=True)
class FileTool:
    """A write tool (``path``, ``content``) or an edit tool (``path``, ``old``, ``new``):
    the names of the tool and of its JSON arguments."""

    name: str
    args: Mapping[str, str]


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path  # the recipe.toml
    launch: tuple[str, ...]
    resume: tuple[str, ...]
    tool: ShellTool
    timeout_s: float = 60.0
    attempts: int = DEFAULT_ATTEMPTS
    promise: str = ""
    available: tuple[str, ...] = ()
    write_tool: FileTool | None = None
    edit_tool: FileTool | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    #: How the harness tells the model a call was interrupted (``[report]``), or None.
    report: re.Pattern[str] | None = None

    @property
    def recipe_dir(self) -> Path:
        return self.path.parent


def builtin_dir() -> Path:
    """Where the built-in recipes live (``durable_spaces/probe/recipes/<name>/``)."""
    return Path(__file__).resolve().parent / "recipes"


def _where(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if _NAME.fullmatch(name_or_path) and not p.exists():
        builtin = builtin_dir() / name_or_path / "recipe.toml"
        if builtin.is_file():
            return builtin
        known = sorted(d.name for d in builtin_dir().glob("*") if (d / "recipe.toml").is_file())
        raise ConfigError(
            f"--harness {name_or_path}: no such recipe file and no built-in recipe of that "
            f"name (built-in: {', '.join(known) or 'none installed'})"
        )
    if p.is_dir():
        p = p / "recipe.toml"
    return p


def _text(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value or "\0" in value:
        raise ConfigError(f"{where} must be a non-empty string")
    return value


def _placeholders(where: str, text: str) -> None:
    for m in _FIELD.finditer(text):
        if m.group(1) not in PLACEHOLDERS:
            raise ConfigError(
                f"{where}: unknown placeholder {{{m.group(1)}}} "
                f"(known: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})"
            )


def _argv(where: str, value: Any, required: bool) -> tuple[str, ...]:
    if value is None and not required:
        return ()
    if value is None:
        raise ConfigError(f"{where} is missing: the command that starts the harness")
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where} must be a non-empty list of strings (an argv)")
    out = tuple(_text(f"{where}[{i}]", v) for i, v in enumerate(value))
    for i, v in enumerate(out):
        _placeholders(f"{where}[{i}]", v)
    return out


def _table(where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"[{where}] must be a table")
    return value


def _file_tool(where: str, value: Any, args: tuple[str, ...]) -> FileTool | None:
    if value is None:
        return None
    t = _table(where, value)
    name = _text(f"[{where}] name", t.get("name"))
    if not _TOOL.fullmatch(name):
        raise ConfigError(f"[{where}] name {name!r}: letters, digits, '_.:-' only")
    unknown = sorted(set(t) - {"name", *args})
    if unknown:
        raise ConfigError(f"[{where}] has unknown keys: {', '.join(unknown)}")
    return FileTool(name, {a: _text(f"[{where}] {a}", t.get(a, a)) for a in args})


def _report(value: Any) -> re.Pattern[str] | None:
    """``[report]``: ``text`` (words the harness's report holds, as they are) or
    ``pattern`` (a Python regular expression), one line each, never matching nothing."""
    if value is None:
        return None
    t = _table("report", value)
    unknown = sorted(set(t) - {"text", "pattern"})
    if unknown or len(t) != 1:
        raise ConfigError("[report] takes one key: text (the harness's words for an "
                          "interrupted call) or pattern (a regular expression)")  # fmt: skip
    key, raw = next(iter(t.items()))
    text = _text(f"[report] {key}", raw)
    if "\n" in text or len(text) > 200:
        raise ConfigError(f"[report] {key} must be one line of at most 200 characters")
    try:
        pattern = re.compile(re.escape(text) if key == "text" else text)
    except re.error as e:
        raise ConfigError(f"[report] pattern {text!r} is not a regular expression: {e}") from None
    if pattern.search(""):
        raise ConfigError(f"[report] {key} {text!r} matches an empty text: it would match "
                          "every result")  # fmt: skip
    return pattern


def _own_programs(where: str, argv: tuple[str, ...], recipe_dir: Path) -> None:
    """Every ``{recipe_dir}/...`` word of ``argv`` names a file that is there."""
    for i, word in enumerate(argv):
        if word.startswith("{recipe_dir}/"):
            rest = word.removeprefix("{recipe_dir}/")
            if _FIELD.search(rest) is None and not (recipe_dir / rest).is_file():
                raise ConfigError(f"{where}[{i}] names {recipe_dir / rest}, which is not there")


def program_error(label: str, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why ``argv`` (a resolved launch or resume command) cannot start: its program is not
    found on the ``PATH`` of ``env``, or not executable; None when it can."""
    prog = argv[0]
    found = shutil.which(prog, path=env.get("PATH", os.defpath))
    if found is not None:
        return None
    if "/" in prog and Path(prog).exists():
        return f"the {label} program {prog} is not executable"
    return f"the {label} program {prog} is not found" + ("" if "/" in prog else " on PATH")


def parse(data: Mapping[str, Any], path: Path) -> Recipe:
    """A recipe from its parsed TOML (``path``: where it was read, for its directory)."""
    known = {"name", "launch", "resume", "timeout_s", "attempts", "promise", "available",
             "tool", "write_tool", "edit_tool", "env", "report"}  # fmt: skip
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown keys: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    name = _text("name", data.get("name"))
    if not _NAME.fullmatch(name):
        raise ConfigError(f"name {name!r}: letters, digits, '_.-', at most 64")
    launch = _argv("launch", data.get("launch"), True)
    resume = _argv("resume", data.get("resume"), False) or launch
    _own_programs("launch", launch, path.parent)
    _own_programs("resume", resume, path.parent)
    timeout = data.get("timeout_s", 60)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 1e5:
        raise ConfigError("timeout_s must be a number of seconds, more than 0, at most 100000")
    attempts = data.get("attempts", DEFAULT_ATTEMPTS)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 20:
        raise ConfigError("attempts must be a whole number from 1 to 20")
    promise = data.get("promise", "")
    if not isinstance(promise, str) or "\n" in promise or len(promise) > 200:
        raise ConfigError("promise must be one line of text")
    if "tool" not in data:
        raise ConfigError("[tool] is missing: the shell tool the model calls (name, argument)")
    t = _table("tool", data["tool"])
    unknown = sorted(set(t) - {"name", "argument"})
    if unknown:
        raise ConfigError(f"[tool] has unknown keys: {', '.join(unknown)}")
    tool = ShellTool(
        _text("[tool] name", t.get("name")), _text("[tool] argument", t.get("argument", "command"))
    )
    if not _TOOL.fullmatch(tool.name):
        raise ConfigError(f"[tool] name {tool.name!r}: letters, digits, '_.:-' only")
    env_t = _table("env", data.get("env", {}))
    env: dict[str, str] = {}
    for k, v in env_t.items():
        if not _ENV.fullmatch(k):
            raise ConfigError(f"[env] {k!r} is not a variable name")
        env[k] = _text(f"[env] {k}", v)
        _placeholders(f"[env] {k}", env[k])
    return Recipe(
        name=name, path=path, launch=launch, resume=resume, tool=tool, timeout_s=float(timeout),
        attempts=attempts, promise=promise,
        available=_argv("available", data.get("available"), False),
        write_tool=_file_tool("write_tool", data.get("write_tool"), ("path", "content")),
        edit_tool=_file_tool("edit_tool", data.get("edit_tool"), ("path", "old", "new")),
        env=env, report=_report(data.get("report")),
    )  # fmt: skip


def load(name_or_path: str) -> Recipe:
    """The recipe a ``--harness`` names: a built-in name, a recipe.toml, or its directory.
    ``ConfigError`` (one line, naming the file) for anything that is not a good recipe."""
    path = _where(name_or_path).absolute()
    try:  # a FIFO, a device, a huge file or a TOML nested too deep: refused, one line
        data = load_toml(path, max_bytes=MAX_RECIPE_BYTES)
    except BadFileError as e:
        raise ConfigError(f"recipe {e}") from None
    except OSError as e:
        raise ConfigError(f"recipe {path} cannot be read: {e.strerror or e}") from None
    try:
        return parse(data, path)
    except ConfigError as e:
        raise ConfigError(f"recipe {path}: {e}") from None


def resolve(template: str, values: Mapping[str, str]) -> str:
    """``template`` with its placeholders filled (all known: ``parse`` checked them)."""
    return _FIELD.sub(lambda m: values[m.group(1)], template)


def values(recipe: Recipe, *, model_url: str, workdir: Path, state_dir: Path, run_id: str,
           prompt: str) -> dict[str, str]:  # fmt: skip
    """The placeholders' values for one run."""
    return {
        "model_url": model_url, "workdir": str(workdir), "state_dir": str(state_dir),
        "run_id": run_id, "prompt": prompt, "recipe_dir": str(recipe.recipe_dir),
        "python": sys.executable,
    }  # fmt: skip
