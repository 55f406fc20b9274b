#!/usr/bin/env bash
# Packs the build tree for the GPU machine into .gpu (the device recipe's
# ../shared/device/pack.sh), then makes sure the pack is whole and small:
# env.sh and every library the ELF files load are there (pack.sh has been
# seen to stop, silently, before both), bench/prune_gpu_pack.sh's pruning,
# no Python venv or 3.11 binding (the GPU machine runs Python 3.12: build
# its binding with -DDGMM_EXTRA_PYTHONS=/path/to/python3.12), and the test
# and benchmark binaries not named in KEEP (a regex on file names; default:
# server_gpu_test, cuda_device_test, process_memory_gpu_test, ~50 MiB)
# removed: every GPU test and bench at once does not fit one call (68 MiB),
# so split them over calls. Prints the size: the device call carries 64 MiB
# with the tracked files (~9 MiB).
#
#   bench/pack_gpu.sh [KEEP]     e.g. bench/pack_gpu.sh 'process_memory_gpu_test|small_job_bench'
#
# DGMM_PACK_XZ=1: the tree then goes into one xz tarball, .gpu/pack.tar.xz
# (CUDA fatbins compress ~15x: every GPU test and bench, 91 MiB, packs into
# 12 MiB); a device script unpacks it first (bench/gpu_call_prelude.sh does):
#   [[ -f .gpu/pack.tar.xz && ! -f .gpu/env.sh ]] && tar xJf .gpu/pack.tar.xz -C .gpu
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
keep=${1:-'^(server_gpu_test|cuda_device_test|process_memory_gpu_test)$'}
pack=${DGMM_PACK:-$root/../shared/device/pack.sh}
"$pack" build .gpu || echo "pack_gpu: $pack exited with $?; completing the pack here" >&2
[[ -d .gpu/build ]] || { echo "pack_gpu: no .gpu/build" >&2; exit 2; }
if [[ ! -f .gpu/env.sh ]]; then
  cat > .gpu/env.sh <<ENV
# sourced on the GPU machine from the repository root
export LD_LIBRARY_PATH="\$PWD/.gpu/lib:/usr/local/cuda/lib64:\${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:\$PATH"
# the build tree names absolute paths of the machine it was built on: recreate them
[[ -e build ]] || ln -s "\$PWD/.gpu/build" "build"
if [[ ! -e "$root" ]]; then mkdir -p "$(dirname "$root")" && ln -s "\$PWD" "$root"; fi
ENV
  echo "pack_gpu: wrote .gpu/env.sh" >&2
fi
"$root/bench/prune_gpu_pack.sh" .gpu > /dev/null
rm -rf .gpu/build/python-venv .gpu/build/python/setuptools .gpu/build/python/dgmm/_core.cpython-311*
{ find .gpu/build/tests/gpu .gpu/build/bench -maxdepth 1 -type f -perm -u+x ! -name '*.sh' \
    ! -name '*.py' ! -name iperf3 2>/dev/null
  find .gpu/build/tests -type f -perm -u+x -name '*_gpu_test' 2>/dev/null; } | sort -u | while read -r f; do
  [[ $(basename "$f") =~ $keep ]] || rm -f "$f"
done
mkdir -p .gpu/lib
libs='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart|libcublas|libcublasLt|libnvidia)'
find .gpu/build -type f \( -perm -u+x -o -name '*.so*' \) | while read -r f; do
  file -b "$f" 2>/dev/null | grep -q '^ELF' || continue
  ldd "$f" 2>/dev/null | awk '/=> \//{print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $libs || $path == /usr/local/cuda* || -e .gpu/lib/$name ]] && continue
  cp -L "$path" .gpu/lib/ && echo "pack_gpu: added $name" >&2
done
ls .gpu/build/python/dgmm/_core*.so 2>/dev/null | sed 's/^/pack_gpu: python binding /' >&2
du -sh .gpu | awk '{print "pack_gpu: .gpu is " $1 " (tracked files add ~9 MiB; the call carries 64 MiB)"}'
if [[ ${DGMM_PACK_XZ:-0} == 1 ]]; then
  tree=$(mktemp -d)
  mv .gpu "$tree/gpu" && mkdir .gpu && tar cJf .gpu/pack.tar.xz -C "$tree/gpu" . && rm -rf "$tree"
  du -sh .gpu/pack.tar.xz | awk '{print "pack_gpu: packed into .gpu/pack.tar.xz, " $1}'
fi
