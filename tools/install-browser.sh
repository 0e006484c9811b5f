#!/usr/bin/env sh
# Debian's headless Chromium and its driver, for the console's browser tests
# (tests/ui). Does nothing when both are installed; needs root (or sudo).
set -eu
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver
