#!/usr/bin/env bash
# Session 13's last device call: GPU region jobs of 4-16 MB on dgmm.empty
# arrays through the packed server (a job worker runs them) and through one
# that runs one such job at a time on gRPC's thread
# (.gpu/new-dgmm-server.xz), in turns. Carry .gpu:
#   bench/run_gpu_session13f.sh COMMIT
source bench/gpu_call_prelude.sh "$@"
xz -dc .gpu/new-dgmm-server.xz > /tmp/new-dgmm-server && chmod +x /tmp/new-dgmm-server
{ echo "# $(date -u +%FT%TZ) commit $C: small_region_job_bench.py --backend auto --server-bin build/service/dgmm-server (c44f21a: a worker) --server-bin /tmp/new-dgmm-server ($C: gRPC's thread, one at a time) --n 1000 1400 2000 --rounds 3 --jobs 200"
  timeout 150 python3 bench/small_region_job_bench.py --backend auto --server-bin build/service/dgmm-server \
    --server-bin /tmp/new-dgmm-server --n 1000 1400 2000 --rounds 3 --jobs 200; } > $R/gpu_here_$C.md 2>&1
cat $R/gpu_here_$C.md
