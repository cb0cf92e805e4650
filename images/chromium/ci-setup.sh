#!/bin/sh
# Debian's chromium, headless: the report test opens a campaign's report.html in it
# (tests/reports/test_failed_run_report.py). Idempotent.
set -eu
if command -v chromium >/dev/null 2>&1; then
  echo "ci-setup(chromium): $(chromium --version 2>/dev/null || echo present)"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends chromium >/dev/null
echo "ci-setup(chromium): installed $(chromium --version 2>/dev/null)"
