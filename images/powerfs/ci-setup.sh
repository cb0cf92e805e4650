#!/bin/sh
# What the powerfs chaos layer (durable_spaces/chaos/powerfs) needs from Debian: libfuse3
# (loaded by the mfusepy binding, which pyproject.toml pulls from PyPI), fusermount3 and
# /etc/fuse.conf from the fuse3 package, and a usable /dev/fuse. Idempotent: a second run
# installs nothing. Without /dev/fuse (a container without --device /dev/fuse) the powerfs
# tests skip with that reason and this script says so; on CI (CI=true), where FUSE is
# required (durable_spaces/campaigns/capabilities.py), it exits 1 saying so.
set -eu
need=""
dpkg-query -W -f='${Status}' fuse3 2>/dev/null | grep -q "install ok installed" || need="$need fuse3"
dpkg-query -W -f='${Status}' libfuse3-3 2>/dev/null | grep -q "install ok installed" \
  || need="$need libfuse3-3"
if [ -n "$need" ]; then
  echo "ci-setup: installing$need"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $need
fi
if [ ! -c /dev/fuse ]; then
  modprobe fuse 2>/dev/null || true
fi
if [ ! -c /dev/fuse ]; then
  case "${CI:-}" in
    true | TRUE | True | 1 | yes)
      echo "ci-setup: /dev/fuse is missing, and CI requires FUSE (powerfs: the power and" \
        "slow-disk campaigns and tests); give the job --device /dev/fuse" >&2
      exit 1
      ;;
  esac
  echo "ci-setup: /dev/fuse is missing: the powerfs tests will skip"
fi
