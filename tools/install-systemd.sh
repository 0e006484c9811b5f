#!/usr/bin/env sh
# systemd's tools (systemd-analyze), for the test that checks the example unit file with
# `systemd-analyze verify` (tests/integration/test_deployment_examples.py). Nothing is started.
# Does nothing when it is installed; needs root (or sudo).
set -eu
if command -v systemd-analyze >/dev/null 2>&1; then
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends systemd
