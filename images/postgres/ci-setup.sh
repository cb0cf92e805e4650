#!/bin/sh
# Install Debian's PostgreSQL server binaries (initdb, pg_ctl) when they are missing, for
# the cluster tests' private server (durable_spaces/cluster/pgserver.py). Idempotent: a
# second run installs nothing. Debian keeps the binaries off PATH, under
# /usr/lib/postgresql/<version>/bin, so both places are checked. No cluster is created
# or started here: each test run starts its own in a temp dir.
set -eu
have_initdb() {
  command -v initdb >/dev/null 2>&1 && return 0
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && return 0
  done
  return 1
}
if have_initdb; then
  echo "ci-setup(postgres): initdb present"
  exit 0
fi
echo "ci-setup(postgres): installing postgresql"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends postgresql >/dev/null
have_initdb || { echo "ci-setup(postgres): initdb still missing after install" >&2; exit 1; }
