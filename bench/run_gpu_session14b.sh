#!/usr/bin/env bash
# Session 14's second device call: server_gpu_test (the GPU ctest left out
# of run_gpu_session14.sh), then a wire settings A/B (bench/wire_ab.sh base
# look chunk base: 16 MiB HTTP/2 lookahead, 4 MiB socket reads). Pack with
# DGMM_PACK_XZ=1 bench/pack_gpu.sh '.'; carry .gpu:
#   bench/run_gpu_session14b.sh COMMIT
source bench/gpu_call_prelude.sh "$@"
start=$(date +%s)
save() { tar czf $OUT/session14b.tgz -C $OUT r; echo "-- $1 done at $(( $(date +%s) - start )) s"; }
cd build && timeout 330 ctest -R '^server_gpu_test$' --output-on-failure > $R/server_gpu_test_$C.log 2>&1; cd ..
tail -15 $R/server_gpu_test_$C.log; save server_gpu_test
{ echo "# $(date -u +%FT%TZ) commit $C: bench/wire_ab.sh --build build --n 20000 --reps 3 base look chunk base look chunk"
  timeout 200 bash bench/wire_ab.sh --build build --n 20000 --reps 3 base look chunk base look chunk; } > $R/wire_ab_look_chunk_$C.csv 2>&1
cat $R/wire_ab_look_chunk_$C.csv; save wire_ab
