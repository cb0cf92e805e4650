"""The set-up scripts of what CI requires fail on CI (``CI=true``) when it is missing, and
only say so elsewhere: ``images/powerfs/ci-setup.sh`` without ``/dev/fuse``,
``images/netns/ci-setup.sh`` where no network namespace can be made."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _env(ci: bool, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci:
        env["CI"] = "true"
    return env | extra


@pytest.mark.parametrize("ci", [False, True], ids=["outside-ci", "on-ci"])
def test_netns_setup_fails_on_ci_where_no_namespace_can_be_made(tmp_path: Path, ci: bool) -> None:
    real = shutil.which("ip")
    if real is None:
        pytest.skip("no ip binary to stand in front of")
    fake = tmp_path / "bin"
    fake.mkdir()
    # an `ip` that refuses namespaces, as a container without CAP_SYS_ADMIN does
    (fake / "ip").write_text(
        '#!/bin/sh\nif [ "$1" = netns ] && [ "$2" = add ]; then\n'
        '  echo "mount --make-shared /run/netns failed: Operation not permitted" >&2; exit 1\n'
        f'fi\nexec {real} "$@"\n'
    )
    (fake / "ip").chmod(0o755)
    env = _env(ci, PATH=f"{fake}:{os.environ['PATH']}")
    r = subprocess.run(["sh", "images/netns/ci-setup.sh"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    said = r.stdout + r.stderr
    assert "Operation not permitted" in said, said
    assert r.returncode == (1 if ci else 0), said
    assert ("CI requires it" in said) is ci


def test_netns_setup_passes_where_a_namespace_can_be_made() -> None:
    r = subprocess.run(["sh", "images/netns/ci-setup.sh"], cwd=ROOT, env=_env(True),
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    if "cannot make a network namespace" in r.stdout + r.stderr:
        pytest.skip(f"no network namespace on this machine: {r.stderr.strip()[-200:]}")
    assert r.returncode == 0 and "can be made" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("ci", [False, True], ids=["outside-ci", "on-ci"])
def test_powerfs_setup_fails_on_ci_without_dev_fuse(tmp_path: Path, ci: bool) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to hide /dev/fuse in a private mount namespace")
    plain = tmp_path / "not-a-device"
    plain.write_text("")
    # /dev/fuse replaced by a plain file in a mount namespace of the script's own (and no
    # module to load: modprobe is not found)
    script = f"mount --bind {plain} /dev/fuse && PATH=/usr/bin:/bin sh images/powerfs/ci-setup.sh"
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       cwd=ROOT, env=_env(ci), capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    said = r.stdout + r.stderr
    if r.returncode != 0 and "mount" in said and "ermission" in said:
        pytest.skip(f"no bind mounts here: {said.strip()[-200:]}")
    assert "/dev/fuse is missing" in said, said
    assert r.returncode == (1 if ci else 0), said
    assert ("CI requires FUSE" in said) is ci
