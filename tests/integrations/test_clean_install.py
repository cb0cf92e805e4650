"""The product installs alone: a clean virtual environment with this checkout's wheel and
nothing else (``core``), or with one framework's extra, from pip's index (the ``pypi``
capability: required on CI). The core imports ``durable_spaces`` and runs a command in a
local Space with none of the lab's packages there, and its ``durable-spaces`` command
says in one line which extra it needs; each framework's environment runs that
framework's page's example (examples.py) and holds none of the lab's packages either.

One environment per extra, kept between runs in ``$XDG_CACHE_HOME/durable-spaces/
clean-venvs/<key>``: the key is what it installs (the Python, the extra, and the
requirement lines pyproject gives the core and the extra), so a changed requirement
builds a new one; the checkout's own wheel is installed again into it each run
(``--no-deps``). Each build and run prints its time (docs/integrations.md has them).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from examples import FRAMEWORKS, ROOT, check_example, run_example
from needs import need

pytestmark = pytest.mark.slow

#: The lab's packages, which none of these environments may hold.
LAB = ("pandas", "matplotlib", "typer", "rich", "hypothesis", "mfusepy")
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
VENVS = CACHE / "durable-spaces" / "clean-venvs"
PIP_TIMEOUT_S = 1800
#: What a copy of the checkout to build from leaves out.
NOT_SOURCE = (".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "*-out")

#: Which of the modules named in argv this interpreter can import.
FOUND = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
CORE_CHECK = """
import asyncio, importlib.util, sys, tempfile
import durable_spaces
from durable_spaces.backends import open_backend

async def main() -> None:
    backend = open_backend("local", tempfile.mkdtemp())
    space = await backend.create("clean")
    await space.advance_epoch(1)
    res = await space.exec(["bash", "-c", "echo hello"], key=None, epoch=1)
    await backend.delete("clean")
    print(res.output.decode().strip())

asyncio.run(main())
print(sorted(m for m in sys.argv[1:] if importlib.util.find_spec(m) is not None))
"""


def requirements(extra: str) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    if extra != "core":
        lines += project["optional-dependencies"][extra]
    return sorted(lines)


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=PIP_TIMEOUT_S, check=False, **kw
    )  # type: ignore[call-overload]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout as a wheel (built once per test process)."""
    need("pypi")
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy: a build writes build/ and *.egg-info beside its source, and two
    # test processes building one checkout at once break each other's.
    source = tmp_path_factory.mktemp("source") / "durable-spaces"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    began = time.monotonic()
    done = _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"clean-install: wheel built in {time.monotonic() - began:.1f} s")
    (built,) = out.glob("durable_spaces-*.whl")
    return built


def venv(extra: str, wheel: Path) -> Path:
    """The environment for ``extra`` (built once per key, under a lock), this checkout's
    wheel installed again into it."""
    key = hashlib.sha256("\n".join([sys.version, extra, *requirements(extra)]).encode())
    where = VENVS / f"{extra}-{key.hexdigest()[:16]}"
    VENVS.mkdir(parents=True, exist_ok=True)
    with _locked(VENVS / f"{where.name}.lock"):
        if not (where / "built").exists():
            shutil.rmtree(where, ignore_errors=True)
            began = time.monotonic()
            done = _run([sys.executable, "-m", "venv", str(where)])
            assert done.returncode == 0, done.stderr[-3000:]
            spec = str(wheel) if extra == "core" else f"{wheel}[{extra}]"
            done = _run([str(where / "bin" / "pip"), "install", "-q", spec])
            assert done.returncode == 0, done.stderr[-3000:]
            took = time.monotonic() - began
            (where / "built").write_text(f"{took:.1f}\n")
            print(f"clean-install: {extra} environment built in {took:.1f} s")
        again = ["install", "-q", "--no-deps", "--force-reinstall", str(wheel)]
        done = _run([str(where / "bin" / "pip"), *again])
        assert done.returncode == 0, done.stderr[-3000:]
    return where


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """``path`` flocked: one test process builds an environment, the others wait."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def test_the_core_alone_opens_a_local_space_without_the_lab(wheel: Path) -> None:
    where = venv("core", wheel)
    done = _run([str(where / "bin" / "python"), "-c", CORE_CHECK, *LAB])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["hello", "[]"]
    cli = _run([str(where / "bin" / "durable-spaces"), "host", "--help"])
    assert cli.returncode == 2
    assert cli.stderr.strip().splitlines() == [
        "durable-spaces: error: the command line needs the lab extra (typer, rich, pandas, "
        "matplotlib not installed): pip install 'durable-spaces[lab]'"
    ]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_framework_extra_alone_runs_its_example(
    wheel: Path, tmp_path: Path, framework: str
) -> None:
    where = venv(framework, wheel)
    python = str(where / "bin" / "python")
    lab = _run([python, "-c", FOUND, *LAB])
    assert lab.stdout.strip() == "[]", lab.stdout
    runs = run_example(python, framework, tmp_path, clean=True)
    print(f"clean-install: {framework} example runs {[round(r.seconds, 1) for r in runs]} s")
    check_example(runs, tmp_path)
