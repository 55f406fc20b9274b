#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after
# `source .gpu/env.sh`: the GPU tests, the idle server's memory breakdown
# and the streaming benchmark on the GPU backend. Everything goes to $OUT (or
# ./gpu-out), each log headed with the date, the GPU, the commit and the
# command.
#
#   bench/run_gpu_stream.sh COMMIT [BUILD_DIR] [stream_bench.sh flags...]
set -uo pipefail
# shellcheck source=bench/gpu_run_setup.sh
source "$(dirname "$0")/gpu_run_setup.sh"  # commit, build, out, header; shifts 2
tests_cmd="ctest --test-dir $build -L gpu --output-on-failure"
{ header "$tests_cmd -V"; $tests_cmd -V 2>&1; echo "ctest exit: $?"; } > "$out/gpu_tests.log" 2>&1
tail -n 12 "$out/gpu_tests.log"
{
  for flags in "--backend=auto" "--backend=auto --cuda_tile_bytes=2MiB" "--backend=cpu"; do
    header "bench/rss_breakdown.sh $build $flags"
    # shellcheck disable=SC2086
    bench/rss_breakdown.sh "$build" $flags
    echo
  done
} > "$out/rss_breakdown.log" 2>&1
cat "$out/rss_breakdown.log"
bench_cmd="bench/stream_bench.sh --build $build --backend auto --commit $commit --out $out/stream $*"
{ header "$bench_cmd"; $bench_cmd 2>&1; echo "stream_bench exit: $?"; } > "$out/stream_console.log" 2>&1
tail -n 30 "$out/stream_console.log"
