#!/usr/bin/env sh
# `sh tools/npm-locked.sh DIR PACKAGE`: install DIR's npm packages as its package-lock.json
# pins them (`npm ci`), unless the version of PACKAGE that DIR/package.json names is already
# installed. Installs npm from Debian when it is missing (root or sudo).
set -eu
dir="$1"
package="$2"
wanted=$(sed -n "s|.*\"$package\": \"\(.*\)\".*|\1|p" "$dir/package.json")
installed=$(sed -n 's/^  "version": "\(.*\)".*/\1/p' \
  "$dir/node_modules/$package/package.json" 2>/dev/null || true)
if [ -n "$wanted" ] && [ "$wanted" = "$installed" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq npm
fi
cd "$dir" && npm ci --no-audit --no-fund --loglevel=error
