#!/usr/bin/env bash
# Installs what is missing (Debian packages), builds everything and runs the
# whole ctest suite (labels: unit, integration, container; gpu tests skip
# without a GPU). The container test installs podman and caches its images.
#
#   ./test.sh [extra ctest args]     e.g. ./test.sh -L unit
set -euo pipefail
root=$(cd "$(dirname "$0")" && pwd)
"$root/scripts/install-deps.sh" build
"$root/scripts/build.sh"
build=${BUILD_DIR:-$root/build}
ctest --test-dir "$build" --output-on-failure -j"${CTEST_JOBS:-2}" --timeout 600 "$@"
