#!/bin/bash
# Sweep 2 (2026-11-30, 2xH200, same build as sweep 1): client block size.
b=build-gpu
run() {
  local label=$1 bb=$2; shift 2
  port=$((30000 + RANDOM % 20000))
  env "$@" $b/service/dgmm-server --listen=127.0.0.1:$port --backend=auto --enable_bench_echo > /tmp/exp_srv.log 2>&1 &
  pid=$!
  for i in $(seq 100); do grep -q "listening on" /tmp/exp_srv.log && break; sleep 0.1; done
  env "$@" $b/bench/stream_bench --target=127.0.0.1:$port --sizes=4000,10000,20000 --reps=9 --block_bytes=$bb --verify=false --header=false 2>&1 | sed "s/^/$label,$bb,/"
  kill $pid; wait $pid 2>/dev/null
}
for bb in 262144 524288 1048576 2097152 4194304; do run base $bb; done
run look16M 1048576 DGMM_EXP_LOOKAHEAD=16777216
