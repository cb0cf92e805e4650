"""``DS_*`` variables are read only at the edge: ``settings.py`` (the product's ``Settings``)
and ``campaigns/spec.py`` (the lab's ``LabSettings``). Every other module receives the
value; this test walks each module's syntax tree and fails on a read of a ``DS_*`` name
from an environment: ``os.environ[...]``, ``.get``/``.pop``/``.setdefault``, ``getenv``,
``in``, whether the name is written out or held by a constant (of this module or imported,
or an attribute of another module), and any call of a ``switch``.

Not reads: writing a child's environment (``env["DS_FAILPOINTS"] = ...``) or removing a
name from it (``env.pop(NAME, None)``, the value dropped), and another
process's environment through psutil (``p.environ().get("DS_SPACE")``: the marks a local
Space puts on its processes, looked for, not settings).
"""

from __future__ import annotations

import ast
from pathlib import Path

import durable_spaces

PACKAGE = Path(durable_spaces.__file__).parent
ROOT = PACKAGE.parent

#: Where the environment is read: the two edges.
EDGES = {
    "durable_spaces.settings": "the product's Settings.from_env",
    "durable_spaces.campaigns.spec": "the lab's LabSettings.from_env (and the records' env)",
}
#: Modules that read ``DS_*`` themselves, each for its reason.
EXCEPTIONS = {
    # The lab's process hooks: they arm themselves in every process from its own
    # environment, the product's processes included, before any configuration exists;
    # the local fork server loads failpoints.py alone (``python -I -S``), so it can
    # import nothing of the package.
    "durable_spaces.chaos.failpoints": "DS_FAILPOINTS, DS_FAILPOINT_TRACE, DS_MUTANTS",
    "durable_spaces.chaos.mutants": "DS_MUTANTS",
}
#: Modules still reading ``DS_*`` (not converted yet): this list only shrinks.
PENDING: dict[str, str] = {}


#: Where the settings are made from the environment (``Settings.from_env``,
#: ``LabSettings.from_env``, ``settings.of`` without settings given): a process's or a
#: command's start, and the public parts a user builds without settings (each takes the
#: environment then, once; every part below them is given the value).
MADE_AT = {
    "durable_spaces.cli.app": "every command's start: a malformed one is one line",
    "durable_spaces.cli.campaigns": "repro's zygote, after a record's environment was taken",
    "durable_spaces.campaigns.spec": "a run record's environment, written and checked",
    "durable_spaces.campaigns.runner": "the product's, once, for the workers and the zygote",
    "durable_spaces.campaigns.replay": "the mutants of a record's environment",
    "durable_spaces.campaigns.worker": "a worker process's start (its exit)",
    "durable_spaces.campaigns.agent": "the scripted driver's start",
    "durable_spaces.probe.recipes.durable-spaces.ds_agent": "the probe recipe's driver",
    "durable_spaces.adapter.durable": "durable_spaces(...) built without settings",
    "durable_spaces.adapter.checkpoints.snapshots": "WorkspaceSnapshots built without them",
    "durable_spaces.backends.local.backend": "LocalBackend(...) built without settings",
    "durable_spaces.backends.spacesd.backend": "SpacesdBackend(...) likewise",
    "durable_spaces.backends.docker.backend": "DockerBackend(...), unavailable_reason()",
    "durable_spaces.backends.docker.image": "make space-image",
    "durable_spaces.backends.microvm.backend": "MicrovmBackend(...), unavailable_reason()",
    "durable_spaces.backends.microvm.image": "make microvm-image",
    "durable_spaces.cluster.pgserver": "PgServer(...), unavailable_reason()",
    "durable_spaces.cluster.remote": "RemoteBackend(...) built without settings",
    "durable_spaces.drive.coordinator": "Coordinator(...) built without settings",
}


def makes(source: str) -> list[int]:
    """Lines of ``source`` that make settings from the environment."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id
            owner = f.value if isinstance(f, ast.Attribute) else None
            on_settings = isinstance(owner, ast.Name) and owner.id.endswith("Settings")
            if (name == "from_env" and on_settings) or name == "settings_of":
                out.append(node.lineno)
    return out


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in PACKAGE.rglob("*.py")}


def _is_ds(value: object) -> bool:
    return isinstance(value, str) and value.startswith("DS_")


def constants(tree: ast.Module) -> dict[str, str]:
    """The module-level names bound to a ``DS_*`` string."""
    out: dict[str, str] = {}
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if isinstance(value, ast.Constant) and _is_ds(value.value):
            out.update({t.id: value.value for t in targets if isinstance(t, ast.Name)})
    return out


TREES = {m: ast.parse(p.read_text()) for m, p in MODULES.items()}
#: Every module's ``DS_*`` constants by name (an attribute ``x.ENV`` of any of them counts).
ALL_CONSTANTS = {name: v for t in TREES.values() for name, v in constants(t).items()}


def _imported(tree: ast.Module) -> dict[str, str]:
    """Names imported from a package module that hold a ``DS_*`` string there."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("durable_spaces"):
            theirs = constants(TREES[node.module]) if node.module in TREES else {}
            for a in node.names:
                if a.name in theirs:
                    out[a.asname or a.name] = theirs[a.name]
    return out


def _psutil_environ(node: ast.expr) -> bool:
    """``<process>.environ()``: another process's environment (psutil)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "environ"
    )


def reads(source: str, known: dict[str, str] | None = None) -> list[str]:
    """Where ``source`` reads a ``DS_*`` name from an environment: ``"line: NAME"``."""
    tree = ast.parse(source)
    names = {**constants(tree), **_imported(tree), **(known or {})}
    #: Names bound to ``<process>.environ()`` (``env = p.environ()``): another process's.
    theirs = {
        t.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _psutil_environ(node.value)
        for t in node.targets
        if isinstance(t, ast.Name)
    }

    #: Calls whose value is dropped (``env.pop(NAME, None)``: a removal, not a read).
    dropped = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}

    def other_process(node: ast.expr) -> bool:
        return _psutil_environ(node) or (isinstance(node, ast.Name) and node.id in theirs)

    def ds(node: ast.expr | None) -> str | None:
        if isinstance(node, ast.Constant) and _is_ds(node.value):
            return str(node.value)
        if isinstance(node, ast.Name):
            return names.get(node.id)
        if isinstance(node, ast.Attribute):
            return ALL_CONSTANTS.get(node.attr)
        return None

    found: list[str] = []
    for node in ast.walk(tree):
        name: str | None = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            if not other_process(node.value):
                name = ds(node.slice)
        elif isinstance(node, ast.Call):
            f = node.func
            attr = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if attr == "switch":
                name = ds(node.args[0]) if node.args else None
                name = name or "switch(...)"
            elif attr in ("get", "pop", "setdefault", "getenv") and node.args:
                if attr == "pop" and id(node) in dropped:
                    continue
                receiver = f.value if isinstance(f, ast.Attribute) else None
                if receiver is None or not other_process(receiver):
                    name = ds(node.args[0])
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn):
            name = ds(node.left)
        if name is not None:
            found.append(f"{getattr(node, 'lineno', 0)}: {name}")
    return found


def test_only_the_edges_read_ds_variables() -> None:
    bad = {}
    for m, p in sorted(MODULES.items()):
        if m in EDGES or m in EXCEPTIONS or m in PENDING:
            continue
        found = reads(p.read_text())
        if found:
            bad[m] = found
    assert not bad, f"DS_* read below the edge (give the value from Settings/LabSettings): {bad}"


def test_settings_are_made_only_where_named() -> None:
    bad = {
        m: found
        for m, p in sorted(MODULES.items())
        if m not in MADE_AT and m not in EDGES and (found := makes(p.read_text()))
    }
    assert not bad, f"settings made from the environment below the edge: {bad}"
    for m in MADE_AT:
        assert makes(MODULES[m].read_text()), f"{m} makes no settings any more: off the list"


def test_a_planted_making_is_found() -> None:
    assert makes("from x import Settings\ns = Settings.from_env()\n")
    assert makes("from x import LabSettings\ns = LabSettings.from_env({})\n")
    assert makes("s = settings_of(None, backend)\n")
    assert not makes("s = CampaignSpec.from_env()\n")


def test_the_lists_are_not_stale() -> None:
    """Every exception and pending module exists and still reads (else it leaves the list)."""
    for m in (*EXCEPTIONS, *PENDING):
        assert m in MODULES, m
        assert reads(MODULES[m].read_text()), f"{m} reads no DS_* any more: take it off the list"


PLANTED = {
    "subscript": 'import os\nx = os.environ["DS_PLANTED"]\n',
    "get": 'import os\nx = os.environ.get("DS_PLANTED", "1")\n',
    "getenv": 'import os\nx = os.getenv("DS_PLANTED")\n',
    "constant": 'import os\nENV = "DS_PLANTED"\ndef f():\n    return os.environ.get(ENV)\n',
    "in": 'import os\nx = "DS_PLANTED" in os.environ\n',
    "switch": "from x import switch\ny = switch(NAME)\n",
    "a mapping": 'def f(env):\n    return env.get("DS_PLANTED")\n',
}


def test_a_planted_read_is_found() -> None:
    """The check can fail: each form of read, planted, is found."""
    for form, source in PLANTED.items():
        assert reads(source), form
    imported = "from durable_spaces.settings import X\n"
    assert reads(imported + "import os\ny = os.environ[X]\n", {"X": "DS_X"})


def test_writes_and_other_processes_are_not_reads() -> None:
    assert not reads('env = {}\nenv["DS_FAILPOINTS"] = "x"\n')
    assert not reads('import os\nos.environ.pop("DS_X", None)\n')
    assert reads('import os\nx = os.environ.pop("DS_X", None)\n')
    assert not reads('def f(p):\n    return p.environ().get("DS_SPACE")\n')
    assert not reads('def f(p):\n    env = p.environ()\n    return env.get("DS_SPACE")\n')
