#!/usr/bin/env bash
# Installs what dgmm needs to build, test and run, from the distribution's
# packages (Debian 12 or Ubuntu 24.04), skipping what is already there.
# Used by ./run.sh, ./test.sh and docker/Dockerfile alike.
#
#   scripts/install-deps.sh [build|compile|runtime|container]   (default: build)
#
# build: compilers, libraries and test tools (prometheus brings promtool, for
# the metrics tests: tests/monitoring); compile: only what building
# dgmm-server and dgmm-cli needs (the image's build stage: no test tools);
# runtime: only the shared libraries dgmm-server and dgmm-cli link (the
# image's runtime stage);
# container: podman and what tests/deploy/run_container.py needs to build and
# run the image (rootful podman with runc and netavark, whose port forwarding
# needs iptables; podman builds without the buildah tool; debootstrap
# for the local base image, podman-compose for docker/compose.yaml).
set -euo pipefail
mode=${1:-build}

runtime_pkgs=(libgrpc++1.51 libprotobuf32 libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0)
container_pkgs=(podman runc netavark aardvark-dns iptables debootstrap podman-compose)
compile_pkgs=(
  build-essential cmake pkg-config ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  grpc-proto prometheus-cpp-dev
)
build_pkgs=(
  "${compile_pkgs[@]}" git ccache
  libgtest-dev libgmock-dev libbenchmark-dev
  clang-14 libclang-rt-14-dev
  python3 python3-grpcio python3-numpy python3-protobuf python3-yaml
  python3-dev pybind11-dev python3-venv python3-setuptools python3-wheel
  iperf3 nginx-light openssl curl
  prometheus
)
case "$mode" in
  build) want=("${build_pkgs[@]}") ;;
  compile) want=("${compile_pkgs[@]}") ;;
  runtime) want=("${runtime_pkgs[@]}") ;;
  container) want=("${container_pkgs[@]}") ;;
  *) echo "usage: $0 [build|compile|runtime|container]" >&2; exit 2 ;;
esac

# Ubuntu 24.04 (the Docker image's base) names some packages differently: t64
# suffixes on runtime libraries, and plain `nginx` where Debian 12 has the
# nginx-light flavour. Map them; Debian's lists above stay as they are.
# clang-14 and libclang-rt-14-dev (libFuzzer, for scripts/fuzz.sh) have the
# same names in both, and so do prometheus-cpp's libraries (no t64 rename).
if grep -q 'ID=ubuntu' /etc/os-release 2>/dev/null; then
  case "$mode" in
    runtime) want=(libgrpc++1.51t64 libprotobuf32t64 libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0) ;;
    build) want=("${want[@]/#nginx-light/nginx}") ;;
  esac
fi

missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#want[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo=""
[[ $(id -u) == 0 ]] || sudo=sudo
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
