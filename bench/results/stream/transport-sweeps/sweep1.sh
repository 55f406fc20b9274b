#!/bin/bash
# Sweep 1 (2026-11-30, 2xH200, build of 5cbc484 plus exp_hooks.patch):
# gRPC transport settings through the patch's environment variables.
b=build-gpu
run() {
  local label=$1 bb=$2; shift 2
  port=$((30000 + RANDOM % 20000))
  env "$@" $b/service/dgmm-server --listen=127.0.0.1:$port --backend=auto --enable_bench_echo > /tmp/exp_srv.log 2>&1 &
  pid=$!
  for i in $(seq 100); do grep -q "listening on" /tmp/exp_srv.log && break; sleep 0.1; done
  env "$@" $b/bench/stream_bench --target=127.0.0.1:$port --sizes=4000,10000 --reps=9 --block_bytes=$bb --verify=false --header=false 2>&1 | sed "s/^/$label,$bb,/"
  kill $pid; wait $pid 2>/dev/null
}
run base 4194304
run look16M 4194304 DGMM_EXP_LOOKAHEAD=16777216
run frame16M 4194304 DGMM_EXP_FRAME=16777215
run chunk1M 4194304 DGMM_EXP_READCHUNK=1048576
run all 4194304 DGMM_EXP_FRAME=16777215 DGMM_EXP_LOOKAHEAD=16777216 DGMM_EXP_READCHUNK=1048576
run base 1048576
run look16M 1048576 DGMM_EXP_LOOKAHEAD=16777216
run all 1048576 DGMM_EXP_FRAME=16777215 DGMM_EXP_LOOKAHEAD=16777216 DGMM_EXP_READCHUNK=1048576
run look64M 4194304 DGMM_EXP_LOOKAHEAD=67108864
