"""The registry of Space backends: a name -> "module:Class", imported only when used.

Hypothesis's habit: backends are found by name, so a backend with heavy or missing
dependencies (docker, QEMU) costs nothing until asked for, and every backend runs the one
conformance suite in ``tests/conformance``.

Each backend here is a package (``local``, ``spacesd``, ``docker``, ``microvm``) whose
``backend`` module holds the class named here; ``guest_rootfs`` is the root filesystem
the docker and microvm images share; ``remote`` lives with the cluster, which it needs.
Dependencies go one way: backends use ``durable_spaces.space``, ``errors`` and ``chaos``
(failpoints, mutants), never the adapter, the harness or the campaigns; docker and
microvm build on spacesd's daemon-backed Space.

Conventions every backend module follows:

- the class takes ``state_dir`` (where it keeps its Spaces) as its first argument, then
  keyword options: ``Class(state_dir, **options)``;
- it satisfies ``SpaceBackend`` and the optional protocols ``CLAIMS`` lists for it, which
  its module proves to mypy (a ``TYPE_CHECKING`` block) and tests/backends check with
  ``isinstance``;
- the module may define ``unavailable_reason() -> str | None``: why the backend cannot run
  on this machine (no binary, no Docker, no QEMU), or None. Tests skip with that reason.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from durable_spaces.errors import ConfigError
from durable_spaces.space import Faults, MachineCheckpoints, SpaceBackend

BACKENDS: dict[str, str] = {
    "local": "durable_spaces.backends.local.backend:LocalBackend",
    "spacesd": "durable_spaces.backends.spacesd.backend:SpacesdBackend",
    "docker": "durable_spaces.backends.docker.backend:DockerBackend",
    "microvm": "durable_spaces.backends.microvm.backend:MicrovmBackend",
    # A driver's view of Spaces that cluster hosts provide (found through the store).
    "remote": "durable_spaces.cluster.remote:RemoteBackend",
}

#: The optional abilities (protocols of ``durable_spaces.space``) each backend has:
#: exactly these, no more and no fewer.
CLAIMS: dict[str, tuple[type, ...]] = {
    "local": (Faults,),
    "spacesd": (Faults,),
    "docker": (Faults,),
    "microvm": (Faults, MachineCheckpoints),
    "remote": (),  # a driver's view: its hosts own the sandboxes and their faults
}


def known_backends() -> list[str]:
    return list(BACKENDS)


def _target(name: str) -> tuple[str, str]:
    try:
        module, _, cls = BACKENDS[name].partition(":")
    except KeyError:
        raise ConfigError(f"unknown Space backend {name!r}; known: {', '.join(BACKENDS)}") from None
    return module, cls


class BackendNotWrittenError(ConfigError):
    """The registry names a backend whose module does not exist (yet)."""


def _module(name: str) -> ModuleType:
    module, _ = _target(name)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:  # the backend itself is missing, not one of its imports
            raise BackendNotWrittenError(f"backend {name} not written yet ({module})") from e
        raise


def unavailable_reason(name: str) -> str | None:
    """Why backend ``name`` cannot run here (module missing, or its own
    ``unavailable_reason()``), or None when it can."""
    try:
        mod = _module(name)
    except BackendNotWrittenError as e:
        return str(e)
    check = getattr(mod, "unavailable_reason", None)
    return check() if callable(check) else None


def backend_class(name: str) -> type[Any]:
    _, cls = _target(name)
    return getattr(_module(name), cls)


def open_backend(name: str, state_dir: str | Path, **options: Any) -> SpaceBackend:
    """Build backend ``name`` keeping its Spaces under ``state_dir``. Raises ConfigError
    for an unknown name (listing the known ones)."""
    return backend_class(name)(state_dir, **options)
