#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after
# `source .gpu/env.sh`: issue 26's wire measurements in one call --
# bench/profile_wire.sh (perf on the server and the client, K = 1 and 8,
# N = 20000), then bench/stripe_bench.sh (jobs against K separate iperf3
# pairs, one way and --bidir, and dgmm-cli against the bench), then
# bench/stream_bench.sh (one stream against one connection; the RSS check and
# the copy count, issue 5's, left out: --rss_n 0 --copy_n 0). Each step's
# console log is headed with the date, the GPU, the commit and the command;
# everything lands in $OUT (or ./gpu-out) as one archive, wire_run.tar.gz
# (the device call brings back only a few files), with the three tables
# beside it.
#
#   bench/run_gpu_wire.sh COMMIT [BUILD_DIR] [steps]
#     steps: any of profile, stripe, stream (default: all three)
#
# The packed tree must hold $BUILD_DIR/bench/perf.tar.xz (cmake --build
# BUILD_DIR --target perf_bundle before packing) for perf; without it the
# profile has /proc's per-thread figures only. About 5 minutes on the H200
# host (profile ~1, stripe ~2.5, stream ~1.5).
set -uo pipefail
# shellcheck source=bench/gpu_run_setup.sh
source "$(dirname "$0")/gpu_run_setup.sh"  # commit, build, out, header; shifts 2
steps=${*:-profile stripe stream}
work=$out/wire_run
mkdir -p "$work"
run() {  # NAME COMMAND...: runs it with a header into $work/NAME_console.log
  local name=$1; shift
  local t0=$SECONDS
  { header "$*"; "$@" 2>&1; echo "$name exit: $? after $(( SECONDS - t0 )) s"; } > "$work/${name}_console.log" 2>&1
  tail -n 25 "$work/${name}_console.log"
}
for step in $steps; do
  case $step in
    profile) run profile bench/profile_wire.sh --build "$build" --backend auto --commit "$commit" --out "$work/profile" ;;
    stripe) run stripe bench/stripe_bench.sh --build "$build" --backend auto --commit "$commit" --out "$work/stripe" ;;
    stream) run stream bench/stream_bench.sh --build "$build" --backend auto --commit "$commit" --rss_n 0 --copy_n 0 --out "$work/stream" ;;
    *) echo "run_gpu_wire.sh: unknown step $step (profile, stripe, stream)" >&2 ;;
  esac
done
tar -C "$out" -czf "$out/wire_run.tar.gz" wire_run
for f in profile/profile_wire_summary.md stripe/stripe_bench.md stream/stream_bench.md; do
  [[ -f $work/$f ]] && cp "$work/$f" "$out/"
done
rm -rf "$work"
ls -la "$out"
