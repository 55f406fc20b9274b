# What every bench/run_gpu_*.sh device script of session 12 on does first;
# source it from the repository root with the script's arguments:
#   source bench/gpu_call_prelude.sh "$@"
# Unpacks .gpu/pack.tar.xz once (DGMM_PACK_XZ=1 bench/pack_gpu.sh), takes the
# pack's environment (.gpu/env.sh) and the Python binding, sets C (the
# commit, the first argument) and R ($OUT/r, made), and writes $R/gpu.txt
# (date, GPU, driver, commit, CPUs).
set -uo pipefail
if [[ -f .gpu/pack.tar.xz && ! -f .gpu/env.sh ]]; then tar xJf .gpu/pack.tar.xz -C .gpu; fi
source .gpu/env.sh
export PYTHONPATH=$PWD/build/python
C=${1:?commit}
R=$OUT/r
mkdir -p "$R"
{ date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; echo "commit $C"; nproc; } > "$R/gpu.txt"
