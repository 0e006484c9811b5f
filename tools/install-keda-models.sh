#!/usr/bin/env sh
# KEDA's resource models from npm (@kubernetes-models/keda: validators generated from KEDA's
# API types), pinned by tools/keda-models/package-lock.json, for the test of the ScaledObjects
# `flowlane manifests kubernetes` writes (tests/app). Does nothing when the locked version is
# installed; needs npm (Debian: `apt-get install npm`).
set -eu
dir="$(dirname "$0")/keda-models"
wanted=$(sed -n 's/.*"@kubernetes-models\/keda": "\(.*\)".*/\1/p' "$dir/package.json")
installed=$(sed -n 's/^  "version": "\(.*\)".*/\1/p' \
  "$dir/node_modules/@kubernetes-models/keda/package.json" 2>/dev/null || true)
if [ "$wanted" = "$installed" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq npm
fi
cd "$dir" && npm ci --no-audit --no-fund --loglevel=error
