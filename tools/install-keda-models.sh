#!/usr/bin/env sh
# KEDA's resource models from npm (@kubernetes-models/keda: validators generated from KEDA's
# API types), pinned by tools/keda-models/package-lock.json, for the test of the ScaledObjects
# `flowlane manifests kubernetes` writes (tests/integration/test_manifests.py). Does nothing
# when the locked version is installed.
set -eu
here="$(dirname "$0")"
sh "$here/npm-locked.sh" "$here/keda-models" @kubernetes-models/keda
