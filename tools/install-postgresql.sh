#!/usr/bin/env sh
# Debian's PostgreSQL 15 (the server programs only are used: tests start their own server
# from /usr/lib/postgresql/15/bin when FLOWLANE_PG_BINDIR names it, see CONTRIBUTING.md),
# so that CI runs the engine on the oldest supported major as well as on the embedded one.
# Does nothing when it is installed; needs root (or sudo).
set -eu
if [ -x /usr/lib/postgresql/15/bin/pg_ctl ]; then
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends postgresql-15
