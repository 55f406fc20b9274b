#!/usr/bin/env bash
# Checks the layering of docs/architecture.md section 1 that the compiler
# would not catch (every header is found through the same include path):
#   - util/ (dgmm_util) includes nothing from service/, client/, proto/ or gRPC;
#   - client/ includes nothing from service/;
#   - every folder of service/ below rpc/ compiles without gRPC: the
#     translation units of core/, backends/, engine/, regions/, pipeline/ and
#     job/, preprocessed, reach no grpc header. Only service/rpc/ and the
#     top of service/ (server, flags, metrics, main.cc) speak gRPC.
# The folder order itself and the absence of include loops: check_order.py.
# Usage: check_layering.sh CXX SOURCE_DIR [-Iextra ...]
set -uo pipefail
cxx=$1
src=$2
shift 2
status=0

fail() {
  echo "layering: $*" >&2
  status=1
}

# Direct includes.
while IFS= read -r hit; do
  fail "util/ must not include service/, client/, proto/ or gRPC: $hit"
done < <(grep -nE '#include [<"](service/|client/|proto/|cli/|dgmm/|grpc)' "$src"/util/*.h "$src"/util/*.cc)
while IFS= read -r hit; do
  fail "client/ must not include service/: $hit"
done < <(grep -rnE '#include [<"]service/' "$src"/client --include='*.h' --include='*.cc')

# Transitive includes of the gRPC-free parts.
units=("$src"/util/*.cc "$src"/service/core/host_buffers.cc "$src"/service/job/*.cc
       "$src"/service/engine/*.cc "$src"/service/pipeline/*.cc "$src"/service/regions/*.cc
       "$src"/service/backends/cpu/*.cc)
if [[ " $* " == *" -DDGMM_HAVE_CUDA=1 "* ]]; then
  units+=("$src"/service/backends/cuda/*.cc)
fi
for unit in "${units[@]}"; do
  deps=$("$cxx" -std=c++20 -M -I"$src" "$@" "$unit" 2>&1) || {
    fail "cannot preprocess $unit: $deps"
    continue
  }
  if grep -qE '/grpc(pp)?/' <<<"$deps"; then
    fail "${unit#"$src"/} reaches gRPC headers: $(grep -oE '[^ ]*/grpc(pp)?/[^ ]*' <<<"$deps" | head -3 | tr '\n' ' ')"
  fi
done
if [[ $status -eq 0 ]]; then echo "layering: ${#units[@]} translation units checked, no leaks"; fi
exit $status
