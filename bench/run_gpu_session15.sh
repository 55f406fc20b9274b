#!/usr/bin/env bash
# Session 15's device call: unary reactors whose OnDone and OnCancel run
# inline (InlineUnaryReactor, service/rpc/reactors.h) against the server
# before them, in turns:
#   (1) small_job_bench (1x1 and 100x100 MultiplySmall jobs against an empty
#       health Check, 1 and 8 threads), 3 rounds, each server binary in turn;
#   (2) small_region_job_bench.py (dgmm.empty jobs through MultiplyRegion,
#       N = 16 and 1000, GPU backend), both binaries in turns;
#   (3) a flat perf profile of the new server under one thread of 1x1 jobs;
#   (4) ctest -L gpu -E server_gpu_test.
# The binary before the change is packed as build/service/dgmm-server-before
# (copied there before rebuilding). Pack with
#   DGMM_PACK_XZ=1 bench/pack_gpu.sh 'small_job_bench|cuda_device_test|process_memory_gpu_test'
# carry .gpu; from the repository root:
#   bench/run_gpu_session15.sh COMMIT BEFORE_COMMIT
source bench/gpu_call_prelude.sh "$@"
B=${2:?the commit of dgmm-server-before}
start=$(date +%s)
save() { tar czf $OUT/session15.tgz -C $OUT r; echo "-- $1 done at $(( $(date +%s) - start )) s"; }
serve() {  # serve BINARY FLAGS...: starts a server, sets spid and port
  local bin=$1 pf; shift; pf=$(mktemp -u)
  $bin --listen=127.0.0.1:0 --port_file=$pf --allow_regions=false "$@" > $R/server_$$.log 2>&1 &
  spid=$!
  for i in $(seq 100); do [ -s $pf ] && break; sleep 0.1; done
  port=$(cat $pf)
}
NEW=build/service/dgmm-server
OLD=build/service/dgmm-server-before
{ echo "# date=$(date -u +%FT%TZ) gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader)"
  echo "# inline: commit $C ($NEW); before: commit $B ($OLD)"
  echo "# command per row: dgmm-server --listen=127.0.0.1:0 --allow_regions=false ; small_job_bench --server=127.0.0.1:PORT --threads=1,8 --seconds=2 --batch= --server_pid=PID"
  for round in 1 2 3; do
    for which in inline before; do
      bin=$NEW; [[ $which == before ]] && bin=$OLD
      serve $bin
      echo; echo "## round $round: $which"
      timeout 60 build/bench/small_job_bench --server=127.0.0.1:$port --threads=1,8 --seconds=2 --batch= --server_pid=$spid
      kill $spid; wait $spid 2>/dev/null
    done
  done; } > $R/small_ab_$C.md 2>&1
grep -E "^## |^\| 1 \||^\| 8 \|" $R/small_ab_$C.md | head -60; save small_ab
{ echo "# date=$(date -u +%FT%TZ) inline: $C, before: $B"
  echo "# command: python3 bench/small_region_job_bench.py --server-bin $NEW --server-bin $OLD --backend auto --n 16 1000 --rounds 2 --jobs 400"
  timeout 150 python3 bench/small_region_job_bench.py --server-bin $NEW --server-bin $OLD \
    --backend auto --n 16 1000 --rounds 2 --jobs 400; } > $R/small_region_ab_$C.md 2>&1
tail -30 $R/small_region_ab_$C.md; save region_ab
PERF=$(command -v perf || true)
if [[ -z "$PERF" && -f build/bench/perf.tar.xz ]]; then
  mkdir -p /tmp/perfb && tar xJf build/bench/perf.tar.xz -C /tmp/perfb
  printf '#!/bin/bash\nLD_LIBRARY_PATH=/tmp/perfb/lib exec /tmp/perfb/perf "$@"\n' > /tmp/perfb/run
  chmod +x /tmp/perfb/run
  PERF=/tmp/perfb/run
fi
if [[ -n "$PERF" ]]; then
  serve $NEW
  timeout 30 build/bench/small_job_bench --server=127.0.0.1:$port --loop_1x1_seconds=1 > /dev/null 2>&1
  timeout 40 "$PERF" record -e cpu-clock -F 2999 -p $spid -o /tmp/perf_new.data -- sleep 6 > $R/perf_record.log 2>&1 &
  ppid=$!
  sleep 0.5
  timeout 30 build/bench/small_job_bench --server=127.0.0.1:$port --loop_1x1_seconds=5 > $R/perf_rate.txt 2>&1
  wait $ppid
  kill $spid; wait $spid 2>/dev/null
  timeout 60 "$PERF" report -i /tmp/perf_new.data --no-children --sort dso,sym --stdio 2>/dev/null | grep -v "^#" | head -100 > $R/perf_top.txt
  timeout 60 "$PERF" report -i /tmp/perf_new.data --no-children --sort comm --stdio 2>/dev/null | grep -v "^#" | head -20 > $R/perf_comm.txt
fi
save perf
cd build && timeout 240 ctest -L gpu -E server_gpu_test --output-on-failure > $R/ctest_gpu_$C.log 2>&1; cd ..
tail -15 $R/ctest_gpu_$C.log; save ctest
