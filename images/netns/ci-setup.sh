#!/bin/sh
# Install the tools the cluster tests' hosts need (durable_spaces/cluster/netns.py): `ip`
# (iproute2) for network namespaces and the bridge, `iptables` for the bridge's rules.
# Idempotent: a second run installs nothing.
set -eu
missing=""
command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
command -v iptables >/dev/null 2>&1 || missing="$missing iptables"
if [ -z "$missing" ]; then
  echo "ci-setup(netns): ip and iptables present"
  exit 0
fi
echo "ci-setup(netns): installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
