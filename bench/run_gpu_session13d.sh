#!/usr/bin/env bash
# Session 13's fourth device call: small BACKEND_AUTO jobs on dgmm.empty
# arrays (host regions) through the current server (GPU) and through one
# whose --auto_cpu_max_bytes also moves such region jobs to the CPU
# (.gpu/new-dgmm-server.xz), in turns. Carry .gpu (the pack_gpu.sh pack):
#   bench/run_gpu_session13d.sh COMMIT
source bench/gpu_call_prelude.sh "$@"
xz -dc .gpu/new-dgmm-server.xz > /tmp/new-dgmm-server && chmod +x /tmp/new-dgmm-server
{ echo "# $(date -u +%FT%TZ) commit $C: small_region_job_bench.py --backend auto --server-bin build/service/dgmm-server (GPU for region jobs) --server-bin /tmp/new-dgmm-server (auto_cpu_max_bytes for region jobs too) --n 16 100 300 512 --rounds 2 --jobs 300"
  timeout 400 python3 bench/small_region_job_bench.py --backend auto --server-bin build/service/dgmm-server \
    --server-bin /tmp/new-dgmm-server --n 16 100 300 512 --rounds 2 --jobs 300; } > $R/region_auto_cpu_$C.md 2>&1
cat $R/region_auto_cpu_$C.md
