# Sourced by bench/run_gpu.sh and bench/run_gpu_stream.sh with their
# arguments (COMMIT [BUILD_DIR] ...): sets commit, build and out (from $OUT,
# else ./gpu-out; created), shifts those two arguments off, and defines
# header CMD, which prints the date, GPU, commit and command lines every log
# starts with.
commit=${1:?commit}
build=${2:-build-gpu}
shift $(( $# >= 2 ? 2 : $# ))
out=${OUT:-gpu-out}
mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
header() {
  echo "# date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "# gpu: ${gpu:-unknown} (x$gpus)"
  echo "# commit: $commit"
  echo "# command: $1"
}
