#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after
# `source .gpu/env.sh`: the streaming benchmark with the server's default
# transport quota (--transport_memory_budget=auto) and with a quota too large
# to ever press (8GiB), alternating A B A B, so that their throughputs can be
# compared within one run. Logs go to $OUT (or ./gpu-out).
#
#   bench/run_gpu_quota_ab.sh COMMIT [BUILD_DIR]
set -uo pipefail
# shellcheck source=bench/gpu_run_setup.sh
source "$(dirname "$0")/gpu_run_setup.sh"  # commit, build, out, header; shifts 2
for round in 1 2; do
  for cfg in auto 8GiB; do
    extra=()
    [[ $cfg != auto ]] && extra=(--transport_memory_budget="$cfg")
    cmd="bench/stream_bench.sh --build $build --backend auto --sizes 4000,10000,20000 --reps 5 --rss_n 0 --copy_n 0 --tcp_seconds 2 --commit $commit --out $out/ab_${cfg}_$round -- ${extra[*]}"
    { header "$cmd"; $cmd 2>&1; } > "$out/ab_${cfg}_$round.console" 2>&1
    echo "== transport_memory_budget=$cfg, round $round"
    grep -E '^\| (4000|10000|20000) ' "$out/ab_${cfg}_$round/stream_bench.md"
  done
done
