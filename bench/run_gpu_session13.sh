#!/usr/bin/env bash
# Ran at c280a24, when the server had --cuda_zero_copy (removed again after
# these runs, bench/results/zero_copy/): at a later commit its zero-copy
# A/B steps fail on the unknown flag. Kept as the record of the command.
# Session 13 device call (issues 25 and 26): zero_copy_bench (dgmm's kernel
# on pinned host memory directly, against the duplex floor); the dgmm.empty
# rows of user_path_bench with the server's zero copy on (the default) and
# off, in turns; every GPU test (ctest -L gpu); bench/wire_ab.sh with HTTP/2
# frame-size and client-window settings. The results are tarred after each
# step ($OUT/session13.tgz), so a call cut short still brings back what ran.
# Pack with DGMM_PACK_XZ=1 bench/pack_gpu.sh '.'. From the repository root,
# carry .gpu:
#   bench/run_gpu_session13.sh COMMIT
source bench/gpu_call_prelude.sh "$@"
start=$(date +%s)
save() { tar czf $OUT/session13.tgz -C $OUT r; echo "-- $1 done at $(( $(date +%s) - start )) s"; }
{ echo "# $(date -u +%FT%TZ) commit $C: build/bench/zero_copy_bench --n=10000,20000 --reps=15"
  timeout 120 build/bench/zero_copy_bench --n=10000,20000 --reps=15; } > $R/zero_copy_$C.md 2>&1
cat $R/zero_copy_$C.md; save zero_copy
for round in 1 2; do
  for zc in true false; do
    timeout 80 python3 bench/user_path_bench.py --build build --commit $C --n 10000 20000 --reps 5 \
      --only empty cupy --server-flags=--cuda_zero_copy=$zc --out $R/user_path_zc_${zc}_$round.md \
      > $R/user_path_zc_${zc}_${round}_console.log 2>&1
    echo "== zero copy $zc, round $round"; grep -E "empty|floor|MET|MISSED" $R/user_path_zc_${zc}_$round.md | head -12
  done
done
save user_path
( time timeout 220 ctest --test-dir build -L gpu --output-on-failure ) > $R/ctest_gpu_$C.log 2>&1
tail -16 $R/ctest_gpu_$C.log; save ctest
timeout 120 bash bench/wire_ab.sh --build build --n 20000 --reps 3 base frame cbdp0 frame_cbdp0 bdp_frame base \
  > $R/wire_ab_$C.csv 2>&1
cat $R/wire_ab_$C.csv; save wire_ab
