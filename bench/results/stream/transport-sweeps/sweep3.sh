#!/bin/bash
# Sweep 3 (2026-11-30, 2xH200): dgmm-server-a = the block decoded on the gRPC
# thread (5cbc484 + exp_hooks.patch), dgmm-server = decoded on the job worker
# (the working tree that became the next commit, + exp_hooks.patch).
b=build-gpu
run() {
  local label=$1 bin=$2; shift 2
  port=$((30000 + RANDOM % 20000))
  env "$@" $b/service/$bin --listen=127.0.0.1:$port --backend=auto --enable_bench_echo > /tmp/exp_srv.log 2>&1 &
  pid=$!
  for i in $(seq 100); do grep -q "listening on" /tmp/exp_srv.log && break; sleep 0.1; done
  env "$@" $b/bench/stream_bench --target=127.0.0.1:$port --sizes=1000,4000,10000 --reps=9 --verify=false --header=false 2>&1 | sed "s/^/$label,4194304,/"
  kill $pid; wait $pid 2>/dev/null
}
for i in 1 2 3; do run inline dgmm-server-a; run worker dgmm-server; done
run worker-look16M dgmm-server DGMM_EXP_LOOKAHEAD=16777216
run inline-look16M dgmm-server-a DGMM_EXP_LOOKAHEAD=16777216
