#!/usr/bin/env bash
# Builds dgmm's libFuzzer harnesses (tests/fuzz/) with clang-14 in their own
# build directory and runs them.
#
#   scripts/fuzz.sh --short [--seconds S]        each harness S seconds (default
#                                                10) on a scratch copy of its seed
#                                                corpus; what ctest's fuzz_short runs
#   scripts/fuzz.sh --long [--runs N] [HARNESS...]
#                                                each harness (default: all) for N
#                                                executions (default 10000000), one
#                                                at a time under nice -n 10, logged to
#                                                BUILD_DIR/logs/HARNESS.log (a run worth
#                                                recording: bench/results/fuzz/README.md)
#   --build-dir DIR                              default: build-fuzz
#   --jobs J                                     build parallelism, default 2
#
# Exits 77 (ctest's skip) when clang++-14 or its libFuzzer runtime is missing
# (scripts/install-deps.sh installs both), non-zero when a harness finds a
# crash, a leak or a broken invariant; the reproducer is kept and named.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=""
seconds=10
runs=10000000
build="$root/build-fuzz"
jobs=2
harnesses=()
while (($#)); do
  case "$1" in
    --short | --long) mode=${1#--} ;;
    --seconds) seconds=$2; shift ;;
    --runs) runs=$2; shift ;;
    --build-dir) build=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) harnesses+=("$1") ;;
  esac
  shift
done
[[ -n $mode ]] || { echo "usage: $0 --short|--long [options] [harness...]" >&2; exit 2; }
((${#harnesses[@]})) || harnesses=(validator stream_assembler npy)

cxx=${FUZZ_CXX:-clang++-14}
cc=${FUZZ_CC:-clang-14}
if ! command -v "$cxx" >/dev/null || ! command -v "$cc" >/dev/null; then
  echo "fuzz.sh: SKIP: $cxx not found (install clang-14 libclang-rt-14-dev)"
  exit 77
fi
if ! "$cxx" -print-file-name=libclang_rt.fuzzer-x86_64.a | grep -q /; then
  echo "fuzz.sh: SKIP: libFuzzer runtime not found (install libclang-rt-14-dev)"
  exit 77
fi
if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
    "$cxx" -x c++ -fsanitize=fuzzer -o /dev/null - 2>/dev/null; then
  echo "fuzz.sh: SKIP: $cxx cannot link -fsanitize=fuzzer (install libclang-rt-14-dev)"
  exit 77
fi

# The commit the harnesses were built from, and whether the files they
# compile differ from it. A `git archive` export names it in .commit.
commit() {
  local inputs=(service/validator.h service/validator.cc service/core/problem.h service/core/problem.cc
                client/cpp/include/dgmm/npy.h client/cpp/src/npy.cc
                client/cpp/include/dgmm/host_memory.h client/cpp/src/host_memory.cc proto tests/fuzz)
  if git -C "$root" rev-parse HEAD >/dev/null 2>&1; then
    echo "$(git -C "$root" rev-parse HEAD)$(git -C "$root" diff --quiet HEAD -- "${inputs[@]}" ||
      echo ' (+ uncommitted changes to the fuzzed sources)')"
  else
    echo "$(cat "$root/.commit" 2>/dev/null || echo unknown) (exported tree)"
  fi
}

start=$(date +%s)
cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDGMM_CUDA=OFF -DDGMM_FUZZ=ON -DDGMM_WERROR=OFF \
  >"$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
cmake --build "$build" -j"$jobs" --target "${harnesses[@]/#/fuzz_}"
echo "fuzz.sh: built ${harnesses[*]} in $(($(date +%s) - start)) s"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
work=$(mktemp -d "${TMPDIR:-/tmp}/dgmm-fuzz.XXXXXX")
failed=()
for h in "${harnesses[@]}"; do
  bin="$build/tests/fuzz/fuzz_$h"
  seeds="$root/tests/fuzz/corpus/$h"
  mkdir -p "$work/$h"
  if [[ $mode == short ]]; then
    args=(-max_total_time="$seconds" -print_final_stats=1)
    log="$work/$h.log"
    runner=()
  else
    args=(-runs="$runs" -print_final_stats=1)
    mkdir -p "$build/logs"
    log="$build/logs/$h.log"
    runner=(nice -n 10)
    {
      echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
      echo "# commit: $(commit)"
      echo "# command: ${runner[*]} $bin ${args[*]} -artifact_prefix=$work/$h- $work/$h $seeds"
      echo "# compiler: $("$cxx" --version | head -1)"
    } >"$log"
  fi
  echo "fuzz.sh: $h (${args[*]})"
  if "${runner[@]}" "$bin" "${args[@]}" -artifact_prefix="$work/$h-" "$work/$h" "$seeds" \
      >>"$log" 2>&1; then
    grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' "$log" | tr '\n' ' '
    echo
  else
    echo "fuzz.sh: $h FAILED; log $log, reproducer(s):"
    ls "$work/$h-"* 2>/dev/null || true
    tail -n 60 "$log"
    failed+=("$h")
  fi
done
echo "fuzz.sh: $mode run of ${harnesses[*]} took $(($(date +%s) - start)) s"
if ((${#failed[@]})); then
  echo "fuzz.sh: FAILED: ${failed[*]} (scratch kept in $work)"
  exit 1
fi
rm -rf "$work"
echo "fuzz.sh: all ${#harnesses[@]} harnesses ran clean"
