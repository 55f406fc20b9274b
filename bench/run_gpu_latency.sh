#!/usr/bin/env bash
# Where small and same-host jobs spend their time on the GPU machine (issues
# 25 and 26), in one device call (~3 min): small dgmm.empty jobs on the GPU
# with the server's region-job and CUDA-context phases (DGMM_TRACE_JOBS=1)
# next to the client's wall and the server's own total; the pinned-region
# timeline at N = 10000 against the duplex floor; and small_job_bench (1x1
# and 100x100 Multiply against an empty RPC) on a default server. Pack with
# DGMM_PACK_XZ=1 bench/pack_gpu.sh 'small_job_bench'. From the repository
# root, carry .gpu:
#   bench/run_gpu_latency.sh COMMIT
source bench/gpu_call_prelude.sh "$@"
timeout 120 python3 bench/small_region_job_bench.py --backend auto --n 16 1000 --rounds 2 --jobs 400 \
  --trace > $R/small_region_trace_$C.md 2>&1
cat $R/small_region_trace_$C.md
timeout 150 python3 bench/pinned_region_timeline.py --build build --n 10000 --reps 15 --trace \
  > $R/pinned_region_timeline_$C.md 2>&1
tail -20 $R/pinned_region_timeline_$C.md
pf=$(mktemp -u)
build/service/dgmm-server --listen=127.0.0.1:0 --port_file=$pf --allow_regions=false > $R/small_server.log 2>&1 &
spid=$!
for i in $(seq 100); do [ -s $pf ] && break; sleep 0.1; done
{ echo "# date=$(date -u +%FT%TZ) commit=$C gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader)"
  echo "# command: dgmm-server --listen=127.0.0.1:0 --port_file=P --allow_regions=false ; small_job_bench --server=127.0.0.1:PORT --threads=1,8 --seconds=3 --batch= --server_pid=PID"
  timeout 60 build/bench/small_job_bench --server=127.0.0.1:$(cat $pf) --threads=1,8 --seconds=3 --batch= --server_pid=$spid; } > $R/small_jobs_$C.md 2>&1
kill $spid; wait $spid 2>/dev/null
cat $R/small_jobs_$C.md
tar czf $OUT/latency.tgz -C $OUT r
