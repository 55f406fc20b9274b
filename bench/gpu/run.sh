#!/usr/bin/env bash
# The GPU runner: packs a CUDA build for the GPU machine, runs named suites
# there, and files what comes back under bench/results/<question>/<gpu>_<commit>/.
# The GPU machine can install nothing and sees only what is shipped to it,
# so the pack holds the build tree, its sources and the shared libraries the
# programs load that the machine lacks. bench/README.md has the recipe.
#
# Here (the build machine):
#   bench/gpu/run.sh pack [--build DIR] [--out DIR] [COMMIT]
#       Without --build: a clean clone of COMMIT (default HEAD) in
#       build-gpu/<commit>/, built with CUDA and a Python 3.12 binding.
#       With --build: that CUDA build as it is (a clean clone of one commit;
#       a missing Python 3.12 binding is built beside it). Writes OUT
#       (default .gpu/): pack.tar.xz, pack.env (where it unpacks) and run.sh
#       (this script).
#   bench/gpu/run.sh collect TARBALL [--command TEXT]
#       Files the suites of a device run (TARBALL: its gpu-results.tgz) into
#       bench/results/<question>/<gpu>_<commit>/, each with a README.md
#       (date, GPU, commit, command). TEXT: the device command, for the READMEs.
#   bench/gpu/run.sh list
#       The suites, with their question folders.
# On a GPU host with a CUDA build of its own: DGMM_BUILD=build bench/gpu/run.sh SUITE...
# There (the GPU machine, from the repository root, the pack carried as .gpu):
#   bash .gpu/run.sh [--within SECONDS] SUITE...
#       writes $OUT/gpu-results.tgz after each suite; --within: cut each
#       suite's time limit so that all end within SECONDS (the call's limit)
set -uo pipefail

# suite -> question (the folder under bench/results/) and what it runs.
declare -A QUESTION=(
  [user-path]=user_path
  [gpu-tests]=gpu_tests
  [same-host]=same_host
  [cli-exit]=cli_exit
  [timeline]=same_host_timeline
)
declare -A DESCRIBE=(
  [user-path]="user_path_bench.py --n 10000 20000 --reps 3: dgmm's Python and C++ clients and dgmm-cli with .npy files (first job and warm) next to NumPy, CuPy and the PCIe floor"
  [gpu-tests]="ctest -L gpu --output-on-failure: every GPU test"
  [cli-exit]="dgmm-cli processes against a started dgmm-server, each timed as a whole against its job's own wall time: a process must end within 1 s of its job"
  [timeline]="same_host_timeline.py --reps 5: first and warm same-host jobs from NumPy arrays (N = 1000 to 20000) next to NumPy and CuPy pinned, with the server's trace of where each warm job's time went, and a CUDA IPC region job against its kernel"
  [same-host]="same_host_after_unary.sh BUILD 46000 (the same-host sequence after unary jobs, then --random=46000 --check), and ipc_bench --kind vmm --n 4000 --reps 5 against a started dgmm-server"
)
SUITES="user-path gpu-tests same-host cli-exit timeline"

die() { echo "gpu/run.sh: $*" >&2; exit 2; }
say() { echo "gpu/run.sh: $*" >&2; }

# ---------------------------------------------------------------- packing
# Libraries an Ubuntu 24.04 GPU machine has (its C and C++ runtimes, the
# CUDA driver and toolkit in /usr/local/cuda, and the base system's
# compression, TLS and systemd libraries): everything else an ELF file of
# the pack loads goes into the pack.
SYSTEM_LIBS='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libresolv\.|libutil\.|libstdc\+\+|libgcc_s|libcuda\.|libcudart|libcublas|libcublasLt|libnvidia|libz\.|libssl\.|libcrypto\.|liblzma\.|libzstd\.|liblz4\.|libbz2\.|libsystemd\.|libcap\.|libgcrypt\.|libgpg-error\.|libffi\.|libselinux\.|libpcre2)'

find_python312() {
  local p
  for p in "${DGMM_GPU_PYTHON:-}" "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 \
           /usr/bin/python3.12; do
    [[ -n $p && -x $p ]] && { echo "$p"; return 0; }
  done
  return 1
}

# Builds dgmm._core for Python 3.12 from SRC into BUILD's staged package, in a
# side build that shares the compiler cache (the GPU machine's Python is 3.12).
add_python312() {
  local src=$1 side=$2 dest=$3 py
  py=$(find_python312) || { say "no Python 3.12 found (DGMM_GPU_PYTHON=...): the user-path suite will fail"; return 0; }
  say "building dgmm._core for $py in $side"
  mkdir -p "$(dirname "$side")"
  CCACHE_BASEDIR=$src nice -n 19 cmake -S "$src" -B "$side" -DCMAKE_BUILD_TYPE=Release \
    -DDGMM_CUDA=OFF -DDGMM_EXTRA_PYTHONS="$py" \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache > "$side.log" 2>&1 &&
    CCACHE_BASEDIR=$src nice -n 19 cmake --build "$side" -j"$(nproc)" \
      --target dgmm_python_ext_extra1 >> "$side.log" 2>&1 ||
    die "the Python 3.12 binding did not build (see $side.log)"
  cp "$side"/python/dgmm/_core.cpython-312*.so "$dest/" || die "no _core.cpython-312*.so in $side"
}

cmd_pack() {
  local root build="" out="" commit=HEAD invocation="bench/gpu/run.sh pack $*"
  root=$(cd "$(dirname "$0")/../.." && pwd)
  while (($#)); do
    case $1 in
      --build) build=$(cd "$2" && pwd) || die "no build $2"; shift 2 ;;
      --out) out=$2; shift 2 ;;
      -*) die "pack: unknown option $1" ;;
      *) commit=$1; shift ;;
    esac
  done
  out=${out:-$root/.gpu}
  local src
  if [[ -z $build ]]; then
    local sha
    sha=$(git -C "$root" rev-parse --short=7 "$commit^{commit}") || die "no commit $commit"
    src=$root/build-gpu/$sha
    if [[ ! -d $src/.git ]]; then
      git clone -q --no-checkout "$root" "$src" && git -C "$src" checkout -q "$sha" || die "clone failed"
    fi
    local py
    py=$(find_python312) || die "no Python 3.12 for the GPU machine's binding (DGMM_GPU_PYTHON=...)"
    say "building $sha in $src/build (CUDA, Python binding for $py)"
    BUILD_DIR=$src/build DGMM_CUDA=ON CMAKE_ARGS="-DDGMM_EXTRA_PYTHONS=$py" \
      nice -n 19 "$src/scripts/build.sh" > "$src/build.log" 2>&1 || die "build failed: $src/build.log"
    build=$src/build
  else
    src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt")
    [[ -d $src ]] || die "$build has no CMakeCache.txt naming its sources"
  fi
  compgen -G "$build/CMakeFiles/*/CMakeCUDACompiler.cmake" > /dev/null ||
    die "$build is not a CUDA build (configure it with -DDGMM_CUDA=ON)"
  [[ -x $build/service/dgmm-server ]] || die "$build has no service/dgmm-server: build it first"
  local sha dirty=""
  sha=$(git -C "$src" rev-parse --short=7 HEAD) || die "$src is not a git checkout"
  [[ -z $(git -C "$src" status --porcelain --untracked-files=no) ]] || dirty=-dirty

  STAGE=$(mktemp -d "${TMPDIR:-/tmp}/dgmm-pack.XXXXXX")
  trap 'rm -rf "$STAGE"' EXIT
  local stage=$STAGE
  local opt=$stage/opt/dgmm-gpu
  mkdir -p "$opt/lib" "$stage$src"
  # The sources (tests and bench scripts read them at their absolute paths;
  # recorded results stay behind).
  git -C "$src" ls-files -z | grep -zv '^bench/results/' |
    (cd "$src" && xargs -0 cp --parents -a -t "$stage$src") || die "copying sources failed"
  # The build tree without what only the build needed.
  mkdir -p "$stage$build"
  tar -C "$build" -cf - --exclude=CMakeFiles --exclude='*.o' --exclude='*.a' \
    --exclude=fuzz-build --exclude=node_modules --exclude=python-venv --exclude=third_party \
    --exclude='*.log' . | tar -C "$stage$build" -xf - || die "copying the build failed"
  if ! ls "$stage$build"/python/dgmm/_core.cpython-312*.so > /dev/null 2>&1; then
    add_python312 "$src" "$root/build-gpu/py312-$sha" "$stage$build/python/dgmm"
  fi
  # Shared libraries the ELF files load that the GPU machine lacks.
  find "$stage$build" -type f \( -perm -u+x -o -name '*.so*' \) -print0 |
    while IFS= read -r -d '' f; do
      file -b "$f" | grep -q '^ELF' && ldd "$f" 2>/dev/null | awk '/=> \//{print $1, $3}'
    done | sort -u | while read -r name path; do
      [[ $name =~ $SYSTEM_LIBS || $path == /usr/local/cuda* || -e $opt/lib/$name ]] && continue
      cp -L "$path" "$opt/lib/"
    done
  cat > "$opt/env.sh" <<ENV
# Sourced on the GPU machine (bench/gpu/run.sh does).
export DGMM_SRC=$src DGMM_BUILD=$build DGMM_COMMIT=$sha$dirty
export LD_LIBRARY_PATH=/opt/dgmm-gpu/lib:/usr/local/cuda/lib64\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
export PATH=/usr/local/cuda/bin:\$PATH
export PYTHONPATH=$build/python\${PYTHONPATH:+:\$PYTHONPATH}
ENV
  { echo "packed: $(date -u +%FT%TZ) from $build by $invocation"
    echo "commit: $(git -C "$src" log -1 --format='%h %cI %s' | cut -c1-120)$dirty"; } > "$opt/PACKED"
  mkdir -p "$out"
  rm -f "$out/pack.tar.xz"
  say "compressing $(du -sh "$stage" | cut -f1) (xz, a minute or two)"
  tar -C "$stage" -cf - . | nice -n 19 xz -T2 -6 > "$out/pack.tar.xz" || die "xz failed"
  printf 'DGMM_SRC=%q\n' "$src" > "$out/pack.env"
  cp "$0" "$out/run.sh"
  say "wrote $out/pack.tar.xz ($(du -h "$out/pack.tar.xz" | cut -f1)), $(ls "$opt/lib" | wc -l) libraries; commit $sha$dirty"
}

# ---------------------------------------------------------------- the GPU machine
# Starts dgmm-server with FLAGS on a free port; sets SERVER_PID and ADDR.
start_server() {
  local portfile
  portfile=$(mktemp -u)
  "$DGMM_BUILD/service/dgmm-server" --listen=127.0.0.1:0 --port_file="$portfile" "$@" \
    > "$R/server.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 600); do [[ -s $portfile ]] && break; sleep 0.1; done
  [[ -s $portfile ]] || { cat "$R/server.log"; return 1; }
  ADDR=127.0.0.1:$(cat "$portfile")
}
stop_server() { kill -TERM "$SERVER_PID" 2> /dev/null; wait "$SERVER_PID" 2> /dev/null; }

# Seconds a suite may take: its own limit, cut to what is left of --within.
limit() {
  local left=$((DEADLINE - $(date +%s) - 20))
  ((left < $1)) && { ((left > 10)) && echo "$left" || echo 10; } || echo "$1"
}

# A program of the packed sources or build, by file name.
program() {
  local where=$1 name=$2 hit
  hit=$(find "$where" -name "$name" -type f ! -path '*/CMakeFiles/*' | head -1)
  [[ -n $hit ]] || { echo "gpu/run.sh: no $name under $where" >&2; return 1; }
  echo "$hit"
}

suite_user_path() {
  {
    echo "kernel: $(uname -r), cpus: $(nproc)"
    for f in enabled shmem_enabled defrag; do
      echo "thp $f: $(cat /sys/kernel/mm/transparent_hugepage/$f 2> /dev/null)"
    done
    python3 --version
  } > "$R/host_facts.txt" 2>&1
  local bench
  bench=$(program "$DGMM_SRC/bench" user_path_bench.py) || return 1
  echo "python3 ${bench#"$DGMM_SRC"/} --build build --commit $DGMM_COMMIT --n 10000 20000 --reps 3" > "$R/command"
  timeout "$(limit 420)" python3 "$bench" --build "$DGMM_BUILD" --commit "$DGMM_COMMIT" --n 10000 20000 \
    --reps 3 --out "$R/report.md"
}

suite_timeline() {
  local bench
  bench=$(program "$DGMM_SRC/bench" same_host_timeline.py) || return 1
  echo "python3 ${bench#"$DGMM_SRC"/} --build build --reps 5" > "$R/command"
  timeout "$(limit 420)" python3 "$bench" --build "$DGMM_BUILD" --reps 5 --out "$R/report.md"
}

suite_gpu_tests() {
  local jobs=${DGMM_CTEST_JOBS:-1}
  echo "ctest --test-dir build -L gpu --output-on-failure -j $jobs" > "$R/command"
  timeout "$(limit 540)" ctest --test-dir "$DGMM_BUILD" -L gpu --output-on-failure -j "$jobs"
}

suite_same_host() {
  local script ipc rc=0
  script=$(program "$DGMM_SRC/bench" same_host_after_unary.sh) || return 1
  ipc=$(program "$DGMM_BUILD/bench" ipc_bench) || return 1
  { echo "bash ${script#"$DGMM_SRC"/} build 46000"
    echo "dgmm-server --listen=127.0.0.1:0; ipc_bench --kind vmm --server ADDR --n 4000 --reps 5"; } > "$R/command"
  echo "## same_host_after_unary.sh build 46000"
  timeout "$(limit 300)" bash "$script" "$DGMM_BUILD" 46000 || rc=1
  echo "## ipc_bench --kind vmm --n 4000 --reps 5"
  start_server || return 1
  timeout "$(limit 120)" "$ipc" --kind vmm --server "$ADDR" --n 4000 --reps 5
  local ipc_rc=$?
  # 3: a timing target missed, which the table shows; anything else: failed.
  ((ipc_rc == 0 || ipc_rc == 3)) || rc=1
  stop_server
  echo "## dgmm-server log (last lines)"
  tail -5 "$R/server.log"
  return $rc
}

kv() { printf '%s=%q\n' "$1" "$2"; }

# A dgmm-cli process timed as a whole; for a multiply, the job's own wall
# time as dgmm-cli prints it and whether the process ended within 1 s of it.
timed_cli() {
  local label=$1 t0 t1 rc job after
  shift
  t0=$(date +%s%N)
  "$@" > "$R/last.out" 2>&1
  rc=$?
  t1=$(date +%s%N)
  job=$(sed -n 's/.* \([0-9.]*\) ms wall (client).*/\1/p' "$R/last.out")
  printf '%-50s rc=%d  process %d ms' "$label" "$rc" $(((t1 - t0) / 1000000))
  if [[ -n $job ]]; then
    after=$(((t1 - t0) / 1000000 - ${job%.*}))
    printf '  job %s ms  exit %d ms after the job: %s' "$job" "$after" \
      "$( ((after < 1000)) && echo 'within 1 s: OK' || echo 'over 1 s: FAILED')"
    ((after < 1000)) || CLI_FAILED=1
  fi
  printf '\n'
  ((rc == 0)) || CLI_FAILED=1
}

suite_cli_exit() {
  local cli=$DGMM_BUILD/client/cpp/dgmm-cli i
  echo "dgmm-server --allow_regions=false; dgmm-cli health, info, 3 x (multiply --random=4000, multiply --random=2000 --mode=unary)" > "$R/command"
  start_server --allow_regions=false || return 1
  CLI_FAILED=0
  timed_cli health "$cli" health --server "$ADDR"
  for i in 1 2 3; do
    timed_cli "multiply --random=4000 #$i" "$cli" multiply --random=4000 --server "$ADDR"
    timed_cli "multiply --random=2000 --mode=unary #$i" "$cli" multiply --random=2000 --mode=unary --server "$ADDR"
  done
  timed_cli info "$cli" info --server "$ADDR"
  stop_server
  return $CLI_FAILED
}

cmd_device() {
  local here out
  DEADLINE=$(($(date +%s) + 100000))
  if [[ ${1:-} == --within ]]; then
    DEADLINE=$(($(date +%s) + $2))
    shift 2
  fi
  here=$(cd "$(dirname "$0")" && pwd)
  out=${OUT:-$PWD/gpu-out}
  mkdir -p "$out"
  if [[ -f $here/pack.tar.xz && ! -f /opt/dgmm-gpu/env.sh ]]; then
    # The pack unpacks at the absolute paths it was built at (the build tree
    # names them); never over a checkout that is there already.
    local DGMM_SRC=""
    # shellcheck disable=SC1091
    source "$here/pack.env"
    [[ ! -e $DGMM_SRC ]] || die "$DGMM_SRC exists here: the pack would unpack over it"
    tar -C / -xJf "$here/pack.tar.xz" || die "unpacking $here/pack.tar.xz failed"
  fi
  if [[ -f /opt/dgmm-gpu/env.sh ]]; then
    # shellcheck disable=SC1091
    source /opt/dgmm-gpu/env.sh
  elif [[ -n ${DGMM_BUILD:-} ]]; then  # a GPU host with a build of its own
    DGMM_SRC=$(cd "$here/../.." && pwd)
    DGMM_BUILD=$(cd "$DGMM_BUILD" && pwd)
    DGMM_COMMIT=$(git -C "$DGMM_SRC" rev-parse --short=7 HEAD)
    export DGMM_SRC DGMM_BUILD DGMM_COMMIT PYTHONPATH=$DGMM_BUILD/python${PYTHONPATH:+:$PYTHONPATH}
    mkdir -p /tmp/dgmm-gpu && echo "packed: none, the build $DGMM_BUILD" > /tmp/dgmm-gpu/PACKED
  else
    die "no pack: run 'bench/gpu/run.sh pack' on the build machine and carry .gpu, or set DGMM_BUILD=BUILD_DIR on a GPU host"
  fi
  local res
  res=$(mktemp -d)
  {
    kv date "$(date -u +%FT%TZ)"
    kv gpu "$(nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1)"
    kv gpus "$(nvidia-smi -L 2> /dev/null | wc -l)"
    kv driver "$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2> /dev/null | head -1)"
    kv commit "$DGMM_COMMIT"
    kv src "$DGMM_SRC"
    kv kernel "$(uname -r)"
    kv cpus "$(nproc)"
    kv packed "$(sed -n 's/^packed: //p' /opt/dgmm-gpu/PACKED /tmp/dgmm-gpu/PACKED 2> /dev/null | head -1)"
    kv pack_commit "$(sed -n 's/^commit: //p' /opt/dgmm-gpu/PACKED 2> /dev/null)"
  } > "$res/meta.env"
  cat "$res/meta.env"
  local suite fn failed=0 t0
  cd "$DGMM_SRC" || die "no $DGMM_SRC"
  for suite in "$@"; do
    [[ -n ${QUESTION[$suite]:-} ]] || { echo "unknown suite $suite (bench/gpu/run.sh list)"; failed=1; continue; }
    R=$res/$suite
    mkdir -p "$R"
    fn=suite_${suite//-/_}
    t0=$(date +%s)
    echo "=== $suite: started $(date -u +%TZ)"
    "$fn" > "$R/console.log" 2>&1
    echo "exit=$?" > "$R/status"
    echo "seconds=$(($(date +%s) - t0))" >> "$R/status"
    tail -n 40 "$R/console.log"
    echo "=== $suite: $(tr '\n' ' ' < "$R/status")"
    tar -C "$res" -czf "$out/gpu-results.tgz" .  # after each suite: a timeout keeps what ended
  done
  return $failed
}

# ---------------------------------------------------------------- collecting
gpu_short() {  # "NVIDIA H100 80GB HBM3" -> h100
  local s
  s=$(echo "$1" | grep -oiE '\b[A-Z]{1,2}[0-9]{2,4}\b' | head -1 | tr 'A-Z' 'a-z')
  echo "${s:-gpu}"
}

cmd_collect() {
  local tarball=${1:?collect TARBALL}
  shift
  local command="bash .gpu/run.sh SUITE..."
  [[ ${1:-} == --command ]] && command=$2
  local root tmp
  root=$(cd "$(dirname "$0")/../.." && pwd)
  tmp=$(mktemp -d)
  tar -C "$tmp" -xzf "$tarball" || die "cannot read $tarball"
  local date="" gpu="" gpus="" driver="" commit="" kernel="" cpus="" pack_commit="" packed="" src=""
  # shellcheck disable=SC1091
  source "$tmp/meta.env"
  # The packed checkout's absolute path and the device's scratch folders
  # name nothing in this repository: the READMEs say paths relative to it.
  [[ -n $src ]] || src=$(sed -n 's|^.* from \(.*\)/build by .*$|\1|p' <<< "$packed")
  local relative=(-e 's|/tmp/tmp\.[A-Za-z0-9]*/[a-z-]*/|$OUT/|g')
  [[ -n $src ]] && relative+=(-e "s|$src/||g" -e "s|$src\b|.|g")
  local gpu_name=$gpu short
  short=$(gpu_short "$gpu_name")
  local suite dir q
  for suite in $(cd "$tmp" && ls -d */ | tr -d /); do
    q=${QUESTION[$suite]:-}
    [[ -n $q ]] || { say "skipping unknown suite $suite"; continue; }
    dir=$root/bench/results/$q/${short}_${commit}
    rm -rf "$dir"
    mkdir -p "$dir"
    local exit seconds
    exit=$(sed -n 's/^exit=//p' "$tmp/$suite/status")
    seconds=$(sed -n 's/^seconds=//p' "$tmp/$suite/status")
    {
      echo "# $suite on the GPU machine"
      echo
      echo "- date: $date"
      echo "- gpu: $gpu_name (x$gpus), driver $driver; kernel $kernel, $cpus CPUs"
      echo "- commit: $commit (${pack_commit:-})"
      echo "- suite: ${DESCRIBE[$suite]}"
      echo "- packed: ${packed:-}"
      echo "- command on the GPU machine: \`$command\`; the suite ran:"
      sed 's/^/  - `/; s/$/`/' "$tmp/$suite/command" 2> /dev/null
      echo "- filed by \`bench/gpu/run.sh collect gpu-results.tgz\`; exit status $exit after $seconds s"
      echo
      case $suite in
        user-path)
          cat "$tmp/$suite/host_facts.txt" 2> /dev/null | sed 's/^/    /'
          echo
          if [[ -s $tmp/$suite/report.md ]]; then
            sed '1{/^# /d}' "$tmp/$suite/report.md"
          else
            echo '```'; tail -n 60 "$tmp/$suite/console.log"; echo '```'
          fi ;;
        gpu-tests)
          echo '```'
          grep -E '^ *[0-9]+/[0-9]+ Test|tests passed|tests failed|Total Test time|\*\*\*' \
            "$tmp/$suite/console.log"
          echo '```'
          if [[ $exit == 124 ]]; then
            echo; echo "Cut by the suite's time limit: a test without a line above did not finish."
          elif [[ $exit != 0 ]]; then
            echo; echo "The failures' output:"; echo; echo '```'
            grep -vE '^ *[0-9]+/[0-9]+ Test|^ *Start ' "$tmp/$suite/console.log" | tail -n 150
            echo '```'
          fi ;;
        *)
          echo '```'; cat "$tmp/$suite/console.log"; echo '```' ;;
      esac
    } > "$dir/README.md"
    sed -i "${relative[@]}" "$dir/README.md"
    say "wrote ${dir#"$root"/}/README.md"
  done
  rm -rf "$tmp"
}

case ${1:-} in
  pack) shift; cmd_pack "$@" ;;
  collect) shift; cmd_collect "$@" ;;
  list) for s in $SUITES; do printf '%-10s bench/results/%s/  %s\n' "$s" "${QUESTION[$s]}" "${DESCRIBE[$s]}"; done ;;
  "" | -h | --help) sed -n '2,/^set /{/^set /d;s/^# \{0,1\}//;p}' "$0" ;;
  *) cmd_device "$@" ;;
esac
