#!/bin/sh
# Install the tools the cluster tests' hosts need (durable_spaces/campaigns/cluster/netns.py): `ip`
# (iproute2) for network namespaces and the bridge, `iptables` for the bridge's rules.
# Idempotent: a second run installs nothing. Then checks that a network namespace and a
# bridge can really be made here (root, a kernel and a container that allow them): where
# they cannot, the cluster tests and the redrive campaign skip, and this script says so;
# on CI (CI=true), where they are required (durable_spaces/campaigns/capabilities.py),
# it exits 1 saying so.
set -eu
missing=""
command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
command -v iptables >/dev/null 2>&1 || missing="$missing iptables"
if [ -z "$missing" ]; then
  echo "ci-setup(netns): ip and iptables present"
else
  echo "ci-setup(netns): installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
probe="dsci$$"
why=""
if ! out=$(ip netns add "$probe" 2>&1); then
  why="ip netns add: $out"
elif ! out=$(ip link add "${probe}b" type bridge 2>&1); then
  why="ip link add type bridge: $out"
fi
ip link del "${probe}b" >/dev/null 2>&1 || true
ip netns del "$probe" >/dev/null 2>&1 || true
if [ -n "$why" ]; then
  case "${CI:-}" in
    true | TRUE | True | 1 | yes)
      echo "ci-setup(netns): cannot make a network namespace here, and CI requires it" \
        "(the cluster tests, the redrive campaign): $why" >&2
      exit 1
      ;;
  esac
  echo "ci-setup(netns): cannot make a network namespace here: the cluster tests will skip ($why)"
else
  echo "ci-setup(netns): a network namespace and a bridge can be made"
fi
