#!/usr/bin/env bash
# Session 11 device call (2026-12-02): GPU tests of the region and device-array
# paths, dgmm.empty with the new and the old Python region call in turns
# (.gpu/arrays_old.py, .gpu/arrays_new.py copied in by hand), the two-sided
# bench and small_job_bench on both backends. From the repository root, carry .gpu:
#   bench/run_gpu_session11.sh COMMIT
set -uo pipefail
source .gpu/env.sh
export PYTHONPATH=$PWD/build/python
C=${1:?commit}
mkdir -p $OUT/tests $OUT/bench
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
# 1. GPU tests touching region jobs and the CUDA path
( time ctest --test-dir build -R "cuda_device_test|process_memory_gpu_test|python_regions_gpu|python_device_arrays_gpu" --output-on-failure ) > $OUT/tests/gpu_tests_$C.log 2>&1
tail -5 $OUT/tests/gpu_tests_$C.log
# 2. dgmm.empty rows: new (RegionCall) then old (grpcio future) arrays.py, in turns
for v in new old new old; do
  if [ $v = old ]; then cp .gpu/arrays_old.py build/python/dgmm/arrays.py; else cp .gpu/arrays_new.py build/python/dgmm/arrays.py; fi
  python3 bench/user_path_bench.py --build build --commit $C --n 10000 20000 --reps 5 --only empty cupy --out $OUT/bench/empty_${v}_$(date +%s).md > $OUT/bench/empty_${v}_console_$(date +%s).log 2>&1
done
cp .gpu/arrays_new.py build/python/dgmm/arrays.py
grep -h "dgmm.empty\|floor\|region reused" $OUT/bench/empty_*.md | head -40
# 3. two-sided vs two one-sided jobs (issue 27)
python3 bench/two_sided_bench.py --build build --n 10000 20000 --reps 5 > $OUT/bench/two_sided_h200_$C.md 2>&1
tail -15 $OUT/bench/two_sided_h200_$C.md
# 4. small jobs vs an empty RPC (issue 26), CPU and CUDA backends
for be in cpu cuda; do
  pf=$(mktemp -u); build/service/dgmm-server --listen=127.0.0.1:0 --port_file=$pf --backend=$be --allow_regions=false > $OUT/bench/small_server_$be.log 2>&1 &
  spid=$!; for i in $(seq 100); do [ -s $pf ] && break; sleep 0.1; done
  echo "# backend=$be date=$(date -u +%FT%TZ) commit=$C" > $OUT/bench/small_jobs_h200_${be}_$C.md
  echo "# command: dgmm-server --listen=127.0.0.1:0 --port_file=P --backend=$be --allow_regions=false; small_job_bench --server=127.0.0.1:PORT --threads=1,8 --seconds=3 --batch= --server_pid=PID" >> $OUT/bench/small_jobs_h200_${be}_$C.md
  build/bench/small_job_bench --server=127.0.0.1:$(cat $pf) --threads=1,8 --seconds=3 --batch= --server_pid=$spid >> $OUT/bench/small_jobs_h200_${be}_$C.md 2>&1
  kill $spid; wait $spid 2>/dev/null
done
cat $OUT/bench/small_jobs_h200_*_$C.md | grep -v "^$" | head -40
python3 -c "import ml_dtypes; print('ml_dtypes', ml_dtypes.__version__)" 2>&1 | tail -1
python3 -c "import torch; print('torch', torch.__version__)" 2>&1 | tail -1
