#!/usr/bin/env sh
# The editor tooling the test suite drives as a real client: the YAML language server
# (tests/compiler/test_language_server.py), pinned by tools/editor-clients/package-lock.json.
# Does nothing when the locked version is installed; installs npm from Debian when missing.
set -eu
here="$(dirname "$0")"
sh "$here/npm-locked.sh" "$here/editor-clients" yaml-language-server
