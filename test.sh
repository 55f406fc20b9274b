#!/usr/bin/env bash
# Installs what is missing (Debian packages), builds everything and runs the
# whole ctest suite (labels: unit, integration, container; gpu tests skip
# without a GPU). The container test installs podman and caches its images.
#
#   ./test.sh [extra ctest args]     e.g. ./test.sh -L unit
set -euo pipefail
root=$(cd "$(dirname "$0")" && pwd)
"$root/scripts/install-deps.sh" build
build=${BUILD_DIR:-$root/build}
# The whole suite: the container test's image (podman, a debootstrapped base,
# the image build: minutes when podman's cache is cold) is built in the
# background from now on, so that its downloads and compile overlap with the
# build below; ctest's deploy_container waits for it (a lock) and finds it
# cached. Its output: $build/tests/deploy/container/prepare.log, which the
# test prints. DGMM_PREPARE_CONTAINER=0 leaves it to the test.
prepare=""
if (($# == 0)) && [[ ${DGMM_PREPARE_CONTAINER:-1} != 0 ]] && [[ -x /usr/bin/python3 ]]; then
  work="$build/tests/deploy/container"
  mkdir -p "$work"
  setsid /usr/bin/python3 "$root/tests/deploy/run_container.py" --prepare --work "$work" \
    > "$work/prepare.log" 2>&1 < /dev/null &
  prepare=$!
  # Stopped with everything it started if this script ends first (a failed build).
  trap '[[ -z $prepare ]] || kill -- -"$prepare" 2>/dev/null || true' EXIT
fi
"$root/scripts/build.sh"
ctest --test-dir "$build" --output-on-failure -j"${CTEST_JOBS:-2}" --timeout 600 "$@"
