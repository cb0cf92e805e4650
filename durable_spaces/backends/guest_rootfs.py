"""The guest root filesystem both image builders start from (the docker Space image and
the microvm guest): Debian bookworm ``minbase`` from debootstrap, trimmed, with the
``cua`` user and its workspace, and the static cua-spacesd from the installed ``cua``
wheel; plus the hashing both use to rebuild only when an input changed.

Nothing is pulled from an image registry: debootstrap reads Debian's package mirror once
and its raw tree is cached as a tarball under ``~/.cache/durable-spaces``
(``DS_CACHE_DIR``), keyed by ``debootstrap_key()``, so every later build of either image
(a recipe change included) runs offline. The steps are written into the tree directly,
with no chroot: nothing of the host runs inside it.

What ends up in a tree is described by ``recipe()``, which both image keys hash: a change
here that the constants do not show must bump ``RECIPE_VERSION``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

from durable_spaces.backends.spacesd.backend import daemon_binary
from durable_spaces.settings import Settings

__all__ = [
    "INCLUDE",
    "SUITE",
    "TRIM",
    "USER_UID",
    "VARIANT",
    "WORKSPACE",
    "cache_dir",
    "daemon_binary",
    "debootstrap_key",
    "file_sha256",
    "input_hash",
    "prepare_rootfs",
    "recipe",
    "rootfs_tarball",
]

#: What debootstrap installs. minbase already has bash, coreutils, findutils, tar, grep,
#: sed, gzip (all Essential); procps adds ps/kill/pgrep for daemon-kill faults and checks;
#: git is what an agent in a sandbox reaches for, and the bench's ``git commit`` peer
#: (``bench/peers.py``) on the tree of a docker or microvm Space.
SUITE = "bookworm"
VARIANT = "minbase"
INCLUDE = ("procps", "git")

USER_UID = 1000
WORKSPACE = "/home/cua/work"

#: Trimmed from the root filesystem: documentation, translations, apt's package lists.
TRIM = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
    "var/lib/apt/lists",
    "var/cache/apt",
    "var/cache/debconf",
    "var/log",
)
#: Directories every guest needs (the daemon's data dir among them).
DIRS = ("var/lib/apt/lists/partial", "var/log", "var/lib/cua-spacesd")

#: Bump when the steps below change in a way the constants ``recipe()`` hashes do not show.
RECIPE_VERSION = 1


def recipe() -> str:
    """What these steps put into a tree (not this module's comments or docs)."""
    return json.dumps([RECIPE_VERSION, TRIM, DIRS, USER_UID, WORKSPACE])


def cache_dir(settings: Settings) -> pathlib.Path:
    """Where the debootstrap tarball is cached (``Settings.cache_dir``)."""
    d = settings.cache_dir
    d.mkdir(parents=True, exist_ok=True)
    return d


def input_hash(*parts: str) -> str:
    """A short hash of build inputs (image tags and directory names)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


_sha_cache: dict[tuple[str, int, int], str] = {}


def file_sha256(path: pathlib.Path) -> str:
    """The sha256 of a file, cached by (path, size, mtime) for this process."""
    st = path.stat()
    k = (str(path), st.st_size, st.st_mtime_ns)
    if k not in _sha_cache:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _sha_cache[k] = h.hexdigest()
    return _sha_cache[k]


def debootstrap_key(settings: Settings) -> str:
    """The tree's inputs: the suite, variant, packages and the mirror
    (``Settings.debian_mirror``)."""
    return input_hash(SUITE, VARIANT, ",".join(INCLUDE), settings.debian_mirror)


def _stderr(msg: str) -> None:
    print(f"[guest-rootfs] {msg}", file=sys.stderr, flush=True)


def rootfs_tarball(settings: Settings, log: Callable[[str], None] = _stderr) -> pathlib.Path:
    """The raw debootstrap tree as a tarball, cached by its parameters (shared by both
    images); only its first build needs the Debian mirror."""
    tar = cache_dir(settings) / f"debootstrap-{SUITE}-{debootstrap_key(settings)}.tar"
    if tar.exists():
        return tar
    if shutil.which("debootstrap") is None:
        raise SystemExit("debootstrap is not installed (apt-get install -y debootstrap)")
    with tempfile.TemporaryDirectory(prefix="ds-debootstrap-", dir=cache_dir(settings)) as tmp:
        root = pathlib.Path(tmp) / "root"
        t0 = time.monotonic()
        cmd = ["debootstrap", f"--variant={VARIANT}"]
        if INCLUDE:
            cmd.append("--include=" + ",".join(INCLUDE))
        cmd += [SUITE, str(root), settings.debian_mirror]
        log(" ".join(cmd))
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        part = tar.with_suffix(f".tar.part{os.getpid()}")
        subprocess.run(  # without the downloaded .debs (much of the tree)
            [
                "tar",
                "--numeric-owner",
                "--exclude=./var/cache/apt/archives/*.deb",
                "-C",
                str(root),
                "-cf",
                str(part),
                ".",
            ],
            check=True,
        )
        part.replace(tar)
        log(f"debootstrap done in {time.monotonic() - t0:.1f}s -> {tar}")
    return tar


def prepare_rootfs(tarball: pathlib.Path, root: pathlib.Path, dirs: Sequence[str] = ()) -> None:
    """Unpack ``tarball`` into the empty directory ``root``, trim it, make ``DIRS`` and
    ``dirs`` (what one image adds), and add the ``cua`` user."""
    subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-xf", str(tarball)], check=True)
    for rel in TRIM:
        shutil.rmtree(root / rel, ignore_errors=True)
    for rel in (*DIRS, *dirs):
        (root / rel).mkdir(parents=True, exist_ok=True)
    _add_user(root)


def _add_user(root: pathlib.Path) -> None:
    """User ``cua`` (uid/gid 1000) with ``WORKSPACE``, written into the files directly."""
    lines = {
        "etc/passwd": f"cua:x:{USER_UID}:{USER_UID}:cua:/home/cua:/bin/bash\n",
        "etc/group": f"cua:x:{USER_UID}:\n",
        "etc/shadow": "cua:!:19000:0:99999:7:::\n",
        "etc/gshadow": "cua:!::\n",
    }
    for rel, text in lines.items():
        p = root / rel
        if p.exists() and not any(ln.startswith("cua:") for ln in p.read_text().splitlines()):
            with p.open("a") as f:
                f.write(text)
    work = root / WORKSPACE.lstrip("/")
    work.mkdir(parents=True, exist_ok=True)
    for d in (work.parent, work):
        os.chown(d, USER_UID, USER_UID)
        d.chmod(0o755)
