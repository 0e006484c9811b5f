#!/usr/bin/env sh
# Debian's pgbouncer (1.18 on Debian 12), for the tests that run flowlane through a
# transaction-mode pooler (tests/runtime/test_pooler.py). Does nothing when it is installed;
# needs root (or sudo). The tests start their own pgbouncer with its own configuration on a
# free port; the package's service is not used.
set -eu
if command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; then
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends pgbouncer
