#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, after
# `source .gpu/env.sh`: the user's-path benchmark (bench/user_path_bench.py,
# issue 25) with the host facts that explain a first job (transparent huge
# pages for shared memory, CPUs, kernel). Output to $OUT (or ./gpu-out).
#
#   bench/run_gpu_user_path.sh COMMIT [BUILD_DIR] [user_path_bench.py flags...]
set -uo pipefail
# shellcheck source=bench/gpu_run_setup.sh
source "$(dirname "$0")/gpu_run_setup.sh"  # commit, build, out, header; shifts 2
python=${DGMM_BENCH_PYTHON:-python3}
export PYTHONPATH=$PWD/$build/python${PYTHONPATH:+:$PYTHONPATH}
{
  header "host facts"
  echo "kernel: $(uname -r), cpus: $(nproc)"
  for f in enabled shmem_enabled defrag; do
    echo "thp $f: $(cat /sys/kernel/mm/transparent_hugepage/$f 2>/dev/null)"
  done
  echo "nr_hugepages: $(cat /proc/sys/vm/nr_hugepages 2>/dev/null)"
  df -T /tmp /dev/shm 2>/dev/null
} > "$out/host_facts.log" 2>&1
cat "$out/host_facts.log"
cmd="$python bench/user_path_bench.py --build $build --commit $commit --out $out/user_path.md $*"
{ header "$cmd"; $cmd 2>&1; echo "user_path_bench exit: $?"; } > "$out/user_path_console.log" 2>&1
tail -n 60 "$out/user_path_console.log"
