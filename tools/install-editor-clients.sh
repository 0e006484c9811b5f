#!/usr/bin/env sh
# The editor tooling the test suite drives as a real client: the YAML language server
# (tests/compiler/test_language_server.py), pinned by tools/editor-clients/package-lock.json.
# Does nothing when the locked version is installed; needs npm (Debian: `apt-get install npm`).
set -eu
dir="$(dirname "$0")/editor-clients"
wanted=$(sed -n 's/.*"yaml-language-server": "\(.*\)".*/\1/p' "$dir/package.json")
installed=$(sed -n 's/^  "version": "\(.*\)".*/\1/p' \
  "$dir/node_modules/yaml-language-server/package.json" 2>/dev/null || true)
if [ -x "$dir/node_modules/.bin/yaml-language-server" ] && [ "$wanted" = "$installed" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq npm
fi
cd "$dir" && npm ci --no-audit --no-fund --loglevel=error
