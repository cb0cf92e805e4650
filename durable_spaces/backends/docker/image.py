"""The docker Space image, built offline: debootstrap base -> ``docker import`` -> Dockerfile.

There is no image registry on these machines, so nothing is pulled: a Debian bookworm
``minbase`` root filesystem comes from debootstrap (Debian's own package mirror), is
trimmed, gets the ``cua`` user and its workspace, and is imported as
``durable-spaces-base:<hash>``. The top-level ``Dockerfile`` then copies the static
cua-spacesd from the installed ``cua`` wheel on top (classic builder, ``DOCKER_BUILDKIT=0``:
Debian's docker.io has no buildx) and becomes ``durable-spaces-space:<hash>``.

Each tag's hash covers its inputs (the recipe below, the Dockerfile, the daemon binary),
so ``ensure_image()`` rebuilds only when one changed. The raw debootstrap tree is cached
as a tarball under ``~/.cache/durable-spaces`` (``DS_CACHE_DIR``), so a rebuild after a
recipe change skips the download. ``python -m durable_spaces.backends.docker.image``
(``make space-image``) is the only entry point.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

#: What debootstrap installs. minbase already has bash, coreutils, findutils, tar, grep,
#: sed, gzip (all Essential); procps adds ps/kill/pgrep for daemon-kill faults and checks.
SUITE = "bookworm"
VARIANT = "minbase"
INCLUDE = ("procps",)
MIRROR = os.environ.get("DS_DEBIAN_MIRROR", "http://deb.debian.org/debian")

BASE_REPO = "durable-spaces-base"
IMAGE_REPO = "durable-spaces-space"
USER_UID = 1000
WORKSPACE = "/home/cua/work"

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]
DOCKERFILE = REPO_ROOT / "Dockerfile"

# Trimmed from the root filesystem: documentation, translations, apt's package lists.
_TRIM = (
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


def cache_dir() -> pathlib.Path:
    d = pathlib.Path(os.environ.get("DS_CACHE_DIR", "~/.cache/durable-spaces")).expanduser()
    d.mkdir(parents=True, exist_ok=True)
    return d


def daemon_binary() -> pathlib.Path:
    """The static cua-spacesd shipped inside the installed ``cua`` wheel."""
    import cua

    return pathlib.Path(cua.__file__).parent / "bin" / "cua-spacesd-linux-x86_64"


_sha_cache: dict[tuple[str, int, int], str] = {}


def _file_sha256(path: pathlib.Path) -> str:
    st = path.stat()
    k = (str(path), st.st_size, st.st_mtime_ns)
    if k not in _sha_cache:
        h = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _sha_cache[k] = h.hexdigest()
    return _sha_cache[k]


def _h(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def debootstrap_key() -> str:
    return _h(SUITE, VARIANT, ",".join(INCLUDE), MIRROR)


def base_tag() -> str:
    recipe = (debootstrap_key(), ",".join(_TRIM), str(USER_UID), WORKSPACE, "v1")
    return f"{BASE_REPO}:{_h(*recipe)}"


def image_tag() -> str:
    """``durable-spaces-space:<hash of base tag, Dockerfile, this module, daemon sha256>``."""
    return f"{IMAGE_REPO}:" + _h(
        base_tag(),
        DOCKERFILE.read_text(),
        pathlib.Path(__file__).read_text(),
        _file_sha256(daemon_binary()),
    )


def _image_exists(tag: str) -> bool:
    r = subprocess.run(["docker", "image", "inspect", tag], capture_output=True)
    return r.returncode == 0


def _log(msg: str) -> None:
    print(f"[space-image] {msg}", file=sys.stderr, flush=True)


def _rootfs_tarball() -> pathlib.Path:
    """Raw debootstrap tree as a tarball, cached by its parameters."""
    tar = cache_dir() / f"debootstrap-{SUITE}-{debootstrap_key()}.tar"
    if tar.exists():
        return tar
    if shutil.which("debootstrap") is None:
        raise SystemExit("debootstrap is not installed (apt-get install -y debootstrap)")
    with tempfile.TemporaryDirectory(prefix="ds-debootstrap-") as tmp:
        root = pathlib.Path(tmp) / "root"
        t0 = time.monotonic()
        cmd = ["debootstrap", f"--variant={VARIANT}"]
        if INCLUDE:
            cmd.append("--include=" + ",".join(INCLUDE))
        cmd += [SUITE, str(root), MIRROR]
        _log(" ".join(cmd))
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        part = tar.with_suffix(".tar.part")
        subprocess.run(  # without the downloaded .debs (about 130 MB of the tree)
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
        _log(f"debootstrap done in {time.monotonic() - t0:.1f}s -> {tar}")
    return tar


def _add_user(root: pathlib.Path) -> None:
    """User ``cua`` (uid/gid 1000) with ``/home/cua/work``, written into the files directly
    (no chroot: nothing of the host runs inside the tree)."""
    line = {
        "etc/passwd": f"cua:x:{USER_UID}:{USER_UID}:cua:/home/cua:/bin/bash\n",
        "etc/group": f"cua:x:{USER_UID}:\n",
        "etc/shadow": "cua:!:19000:0:99999:7:::\n",
        "etc/gshadow": "cua:!::\n",
    }
    for rel, text in line.items():
        p = root / rel
        if p.exists() and not any(ln.startswith("cua:") for ln in p.read_text().splitlines()):
            with p.open("a") as f:
                f.write(text)
    work = root / WORKSPACE.lstrip("/")
    work.mkdir(parents=True, exist_ok=True)
    for d in (work.parent, work):
        os.chown(d, USER_UID, USER_UID)
        d.chmod(0o755)
    for rel in ("var/lib/cua-spacesd", "run/cua", "var/log"):
        (root / rel).mkdir(parents=True, exist_ok=True)


def build_base() -> str:
    tag = base_tag()
    if _image_exists(tag):
        return tag
    src = _rootfs_tarball()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ds-rootfs-") as tmp:
        root = pathlib.Path(tmp) / "root"
        root.mkdir()
        subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-xf", str(src)], check=True)
        for rel in _TRIM:
            shutil.rmtree(root / rel, ignore_errors=True)
        (root / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
        _add_user(root)
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


def build_image(force: bool = False) -> str:
    """Build (or reuse) the Space image and return its tag."""
    tag = image_tag()
    if not force and _image_exists(tag):
        _log(f"{tag} is up to date")
        return tag
    base = build_base()
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
    tag = build_image(force="--force" in sys.argv[1:])
    prune_old(tag)
    print(tag, flush=True)
    _log(f"total {time.monotonic() - t0:.1f}s")


if __name__ == "__main__":
    main()
