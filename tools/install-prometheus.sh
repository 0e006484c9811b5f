#!/usr/bin/env sh
# Debian's Prometheus server, for the metrics test that lets a real Prometheus scrape
# `flowlane serve` (tests/runtime/test_metrics.py). Does nothing when it is installed;
# needs root (or sudo). The test starts its own server on a free port; the package's
# service is not used.
set -eu
if command -v prometheus >/dev/null 2>&1; then
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus
