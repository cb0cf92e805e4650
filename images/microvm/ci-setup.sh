#!/bin/sh
# Install what the microvm backend needs (QEMU, qemu-img, debootstrap, busybox-static,
# mkfs.ext4) when missing, then build the guest image and its base checkpoint.
# Idempotent: a second run installs nothing and `make microvm-image` finds it up to date.
set -eu
cd "$(dirname "$0")/../.."
need=""
command -v qemu-system-x86_64 >/dev/null 2>&1 || need="$need qemu-system-x86"
command -v qemu-img >/dev/null 2>&1 || need="$need qemu-utils"
command -v debootstrap >/dev/null 2>&1 || need="$need debootstrap"
command -v mkfs.ext4 >/dev/null 2>&1 || need="$need e2fsprogs"
command -v file >/dev/null 2>&1 || need="$need file"
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q "install ok installed" \
  || need="$need busybox-static"
if [ -n "$need" ]; then
  echo "ci-setup: installing$need"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $need
fi
make microvm-image
