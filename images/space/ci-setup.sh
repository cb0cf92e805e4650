#!/usr/bin/env bash
# Prepare this machine for docker Spaces (idempotent): docker.io + debootstrap installed,
# dockerd running, the Space image built. .ci/run calls it; a developer may too.
set -euo pipefail
cd "$(dirname "$0")/../.."

missing=()
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)  # a docker client alone is not an engine
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if ((${#missing[@]})); then
  echo "[ci-setup] installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  echo "[ci-setup] starting dockerd"
  nohup dockerd >/var/log/dockerd.log 2>&1 &
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || { echo "[ci-setup] dockerd did not start:"; tail -20 /var/log/dockerd.log; exit 1; }
fi

make space-image
