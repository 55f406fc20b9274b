#!/usr/bin/env bash
# Session 13's third device call (issue 26 on current main): stripe_bench.sh
# and stream_bench.sh against the loopback's iperf3 ceilings
# (bench/run_gpu_wire.sh's stripe and stream steps), small_job_bench (1x1
# and 100x100 jobs against an empty RPC), and wire_ab's client poller A/B
# (base vs epoll1, in turns). Pack with DGMM_PACK_XZ=1 bench/pack_gpu.sh '.';
# carry .gpu:
#   bench/run_gpu_session13c.sh COMMIT
source bench/gpu_call_prelude.sh "$@"
start=$(date +%s)
save() { tar czf $OUT/session13c.tgz -C $OUT r; echo "-- $1 done at $(( $(date +%s) - start )) s"; }
pf=$(mktemp -u)
build/service/dgmm-server --listen=127.0.0.1:0 --port_file=$pf --allow_regions=false > $R/small_server.log 2>&1 &
spid=$!
for i in $(seq 100); do [ -s $pf ] && break; sleep 0.1; done
{ echo "# date=$(date -u +%FT%TZ) commit=$C gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader)"
  echo "# command: dgmm-server --listen=127.0.0.1:0 --port_file=P --allow_regions=false ; small_job_bench --server=127.0.0.1:PORT --threads=1,8 --seconds=3 --batch= --server_pid=PID"
  timeout 60 build/bench/small_job_bench --server=127.0.0.1:$(cat $pf) --threads=1,8 --seconds=3 --batch= --server_pid=$spid; } > $R/small_jobs_$C.md 2>&1
kill $spid; wait $spid 2>/dev/null
cat $R/small_jobs_$C.md; save small_jobs
OUT_SAVED=$OUT
timeout 330 bash bench/run_gpu_wire.sh $C build stripe stream > $R/wire_console.log 2>&1
tail -40 $R/wire_console.log; cp $OUT/stripe_bench.md $OUT/stream_bench.md $R/ 2>/dev/null; save wire
timeout 100 bash bench/wire_ab.sh --build build --n 20000 --reps 3 base epoll1 base epoll1 > $R/wire_ab_epoll_$C.csv 2>&1
cat $R/wire_ab_epoll_$C.csv; save wire_ab
