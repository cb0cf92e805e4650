"""The docker Space image, built offline: the guest root filesystem -> ``docker import``
-> Dockerfile.

There is no image registry on these machines, so nothing is pulled: the shared guest
root filesystem (``guest_rootfs``: debootstrap minbase, trimmed, the ``cua`` user and its
workspace) is imported as ``durable-spaces-base:<hash>``. The top-level ``Dockerfile``
then copies the static cua-spacesd from the installed ``cua`` wheel on top (classic
builder, ``DOCKER_BUILDKIT=0``: Debian's docker.io has no buildx) and becomes
``durable-spaces-space:<hash>``.

Each tag's hash covers its inputs (the shared recipe, the Dockerfile, this module, the
daemon binary), so ``build_image()`` rebuilds only when one changed.
``python -m durable_spaces.backends.docker.image`` (``make space-image``) is the only
entry point.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from durable_spaces.backends import guest_rootfs
from durable_spaces.backends.guest_rootfs import daemon_binary, file_sha256, input_hash
from durable_spaces.settings import Settings

BASE_REPO = "durable-spaces-base"
IMAGE_REPO = "durable-spaces-space"

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]
DOCKERFILE = REPO_ROOT / "Dockerfile"
#: What this image adds to the shared tree (the token's mount point).
_DIRS = ("run/cua",)


def base_tag(settings: Settings) -> str:
    recipe = (guest_rootfs.debootstrap_key(settings), guest_rootfs.recipe(), ",".join(_DIRS))
    return f"{BASE_REPO}:{input_hash(*recipe)}"


def image_tag(settings: Settings) -> str:
    """``durable-spaces-space:<hash of base tag, Dockerfile, this module, daemon sha256>``."""
    return f"{IMAGE_REPO}:" + input_hash(
        base_tag(settings),
        DOCKERFILE.read_text(),
        pathlib.Path(__file__).read_text(),
        file_sha256(daemon_binary()),
    )


def _image_exists(tag: str) -> bool:
    r = subprocess.run(["docker", "image", "inspect", tag], capture_output=True)
    return r.returncode == 0


def _log(msg: str) -> None:
    print(f"[space-image] {msg}", file=sys.stderr, flush=True)


def build_base(settings: Settings) -> str:
    tag = base_tag(settings)
    if _image_exists(tag):
        return tag
    src = guest_rootfs.rootfs_tarball(settings, _log)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ds-rootfs-") as tmp:
        root = pathlib.Path(tmp) / "root"
        root.mkdir()
        guest_rootfs.prepare_rootfs(src, root, _DIRS)
        tar = subprocess.Popen(
            ["tar", "--numeric-owner", "-C", str(root), "-c", "."], stdout=subprocess.PIPE
        )
        imp = subprocess.run(
            ["docker", "import", "-", tag], stdin=tar.stdout, stdout=subprocess.DEVNULL
        )
        assert tar.stdout is not None
        tar.stdout.close()
        if tar.wait() != 0 or imp.returncode != 0:
            raise SystemExit(f"docker import of {tag} failed")
    _log(f"imported {tag} in {time.monotonic() - t0:.1f}s")
    return tag


def build_image(settings: Settings, force: bool = False) -> str:
    """Build (or reuse) the Space image and return its tag."""
    tag = image_tag(settings)
    if not force and _image_exists(tag):
        _log(f"{tag} is up to date")
        return tag
    base = build_base(settings)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ds-context-") as ctx:
        c = pathlib.Path(ctx)
        shutil.copy2(DOCKERFILE, c / "Dockerfile")
        shutil.copy2(daemon_binary(), c / "cua-spacesd")
        (c / "cua-spacesd").chmod(0o755)
        env = dict(os.environ, DOCKER_BUILDKIT="0")
        subprocess.run(
            ["docker", "build", "-q", "--build-arg", f"BASE={base}", "-t", tag, str(c)],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
    _log(f"built {tag} in {time.monotonic() - t0:.1f}s")
    return tag


def prune_old(keep: str) -> None:
    """Remove older tags of the Space image that no container uses (in-use ones stay)."""
    r = subprocess.run(
        ["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", IMAGE_REPO],
        capture_output=True,
        text=True,
    )
    old = [t for t in r.stdout.split() if t != keep and t.startswith(IMAGE_REPO + ":")]
    for tag in old:
        subprocess.run(["docker", "image", "rm", tag], capture_output=True)


def main() -> None:
    t0 = time.monotonic()
    tag = build_image(Settings.from_env(), force="--force" in sys.argv[1:])
    prune_old(tag)
    print(tag, flush=True)
    _log(f"total {time.monotonic() - t0:.1f}s")


if __name__ == "__main__":
    main()
