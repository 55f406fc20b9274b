#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after
# `source .gpu/env.sh`: the striping benchmark (issue 15) on the GPU backend,
# K = 1, 2, 4, 8 and auto at N = 10000 and 20000 next to K separate iperf3
# pairs (one way and --bidir), plus small N and dgmm-cli against the bench.
# Everything goes to $OUT (or ./gpu-out), the console log headed with the
# date, the GPU, the commit and the command.
#
#   bench/run_gpu_stripe.sh COMMIT [BUILD_DIR] [stripe_bench.sh flags...]
#
# What the packed tree must hold (../shared/device/pack.sh plus pruning):
#   $BUILD_DIR/service/dgmm-server, $BUILD_DIR/bench/stripe_bench,
#   $BUILD_DIR/client/cpp/dgmm-cli and the
#   gRPC/protobuf/Abseil libraries they load (pack.sh adds them);
#   $BUILD_DIR/bench/iperf3 (bench/CMakeLists.txt copies the build machine's)
#   with the libraries it loads: libiperf.so.0, libsctp.so.1 (and
#   libcrypto.so.3, on the GPU machine already) -- without them the iperf3
#   columns say n/a; python3 (the table; the GPU machine has it).
# N = 20000 float32 needs about 3.2 GB of client memory and moves 3.2 GB per
# job; with --reps 3 and 5 K values the large sizes take a few minutes.
set -uo pipefail
# shellcheck source=bench/gpu_run_setup.sh
source "$(dirname "$0")/gpu_run_setup.sh"  # commit, build, out, header; shifts 2
bench_cmd="bench/stripe_bench.sh --build $build --backend auto --commit $commit --out $out/stripe $*"
{ header "$bench_cmd"; $bench_cmd 2>&1; echo "stripe_bench exit: $?"; } > "$out/stripe_console.log" 2>&1
tail -n 30 "$out/stripe_console.log"
