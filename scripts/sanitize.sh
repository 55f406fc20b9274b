#!/usr/bin/env bash
# Builds dgmm's CPU service and its C++ tests with a gcc sanitizer and runs the
# unit and integration suites under it (the server processes the tests start
# are instrumented too).
#
#   scripts/sanitize.sh asan [options] [-- extra ctest args]
#                                    AddressSanitizer + UndefinedBehaviorSanitizer
#                                    (and LeakSanitizer, with scripts/lsan.supp)
#   scripts/sanitize.sh tsan [options] [-- extra ctest args]
#                                    ThreadSanitizer, with scripts/tsan.supp
#   --build-dir DIR                  default: build-asan / build-tsan
#   --jobs J                         build and ctest parallelism, default 2
#   --exclude REGEX                  ctest -E; default: the tests that cannot
#                                    run instrumented or take too long (below)
#
# Every sanitizer report, from a test or from a dgmm-server it started, is
# written under DIR/sanitizer-logs/; the script fails if any is there, even
# when every test passed (a server's report at exit fails no test by itself).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-}
case "$mode" in
  asan | tsan) shift ;;
  *) echo "usage: $0 asan|tsan [--build-dir DIR] [--jobs J] [--exclude REGEX] [-- ctest args]" >&2
     exit 2 ;;
esac
build="$root/build-$mode"
jobs=2
# fuzz_short: its own clang build (tests/fuzz). cli_install_test: builds an
# uninstrumented consumer against the instrumented library. load_test_short:
# minutes of SIGKILLs and restarts, run by hand (tests/stress). The N=15000
# stream (StreamLargeTest.StreamedN20000...) takes too long instrumented on
# 2 cores. python_/node_/deploy_: no C++ of ours to instrument in the test.
# attacks_short: the Python attack bench (its floods take minutes against an
# instrumented server; the hardening_test covers the same paths in C++).
# Hardening.UnaryFlood... and Hardening.GzipBomb... assert the server's RSS,
# which a sanitizer's shadow memory and quarantine inflate (ASan: 450 MiB
# peak where the bound is 288 MiB); they run uninstrumented in ./test.sh.
exclude='fuzz_short|cli_install_test|load_test_short|StreamedN20000|python_|node_|deploy_|attacks_short|Hardening.UnaryFlood|Hardening.GzipBomb'
# Under TSan (5-15x slower, several times the memory) also: the 8000x8000
# unary job (17 GB resident, killed by the OOM killer on a 24 GB machine) and
# the two client suites that stream large jobs (over their 300 s timeout);
# scaleout_nginx also ran past its timeout under TSan (not investigated).
if [[ $mode == tsan ]]; then
  # cli_reconnect_test asserts reconnects within 2 s, a timing an
  # instrumented server and client do not keep.
  # AdmissionServer.StreamThatCanNeverFit... asserts the server's RSS grows
  # under 16 MiB: 54 MB under TSan at 0c8e093 (TSan's per-thread state and
  # shadow), 0.75 MiB uninstrumented.
  # conformance_cpp: its runner reads the case files with protobuf's JSON
  # parser into a google.protobuf.Struct, whose Map the uninstrumented
  # libprotobuf fills and the TSan-compiled headers read with another layout
  # (protobuf's PROTOBUF_TSAN): SEGV in map.h before any test runs. Under
  # ASan and uninstrumented it passes.
  exclude+='|OriginalQuestionUnary8000|cli_client_integration_test|cli_command_integration_test|scaleout_nginx|cli_reconnect_test|StreamThatCanNeverFit|conformance_cpp'
fi
ctest_args=()
while (($#)); do
  case "$1" in
    --build-dir) build=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    --exclude) exclude=$2; shift ;;
    --) shift; ctest_args=("$@"); break ;;
    *) echo "sanitize.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done

if [[ $mode == asan ]]; then
  flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
else
  flags="-fsanitize=thread -fno-omit-frame-pointer"
fi
logs="$build/sanitizer-logs"
start=$(date +%s)
mkdir -p "$build"
project_include=()
if [[ $mode == tsan ]]; then
  # The CPU kernels use target_clones: their ifunc resolvers run while the
  # dynamic loader relocates the program, before TSan's runtime is up, and
  # crash if instrumented. Build that one file without TSan (the kernels are
  # data-parallel loops; the thread pool and the job logic elsewhere keep it).
  cat >"$build/tsan-exemptions.cmake" <<'CMAKE'
cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL set_source_files_properties
  ${CMAKE_SOURCE_DIR}/service/backends/cpu/cpu_device.cc
  DIRECTORY ${CMAKE_SOURCE_DIR}/service PROPERTIES COMPILE_OPTIONS -fno-sanitize=thread)
CMAKE
  project_include=(-DCMAKE_PROJECT_INCLUDE="$build/tsan-exemptions.cmake")
fi
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDGMM_CUDA=OFF \
  -DDGMM_WERROR=OFF -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
  -DCMAKE_SHARED_LINKER_FLAGS="$flags" "${project_include[@]}" >"$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j"$jobs"
built=$(date +%s)
echo "sanitize.sh: $mode build took $((built - start)) s"

rm -rf "$logs"
mkdir -p "$logs"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:log_path=$logs/asan:${ASAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=$root/scripts/lsan.supp:${LSAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$logs/ubsan:${UBSAN_OPTIONS:-}"
export TSAN_OPTIONS="suppressions=$root/scripts/tsan.supp:halt_on_error=0:second_deadlock_stack=1:log_path=$logs/tsan:${TSAN_OPTIONS:-}"
status=0
ctest --test-dir "$build" -L 'unit|integration' -E "$exclude" --output-on-failure \
  -j"$jobs" --timeout 900 "${ctest_args[@]}" || status=$?
echo "sanitize.sh: $mode tests took $(($(date +%s) - built)) s (ctest exit $status)"

# LSan also writes the list of suppressions it used; only real reports count.
reports=$(grep -l -E 'ERROR: (Address|Leak)Sanitizer|runtime error:|WARNING: ThreadSanitizer' \
  -r "$logs" | sort || true)
if [[ -n $reports ]]; then
  echo "sanitize.sh: sanitizer reports:"
  for f in $reports; do
    echo "==== $f"
    head -n 80 "$f"
  done
  status=1
else
  echo "sanitize.sh: no sanitizer reports"
fi
exit "$status"
