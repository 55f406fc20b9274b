#!/usr/bin/env bash
# Packs this machine's perf with the shared libraries it loads into one
# archive, for bench/profile_wire.sh on a machine that has no perf and cannot
# install it (the GPU machine: Ubuntu 24.04). bench/CMakeLists.txt runs it
# (target perf_bundle) to write $build/bench/perf.tar.xz, which a packed
# build tree (../shared/device/pack.sh) then carries as a plain file: pack.sh
# copies the libraries of ELF files only, so perf's libraries (libperl,
# libpython, libdw, ... about 19 MB, 6-7 MB compressed) stay inside the
# archive and never reach the pack's shared lib/ folder, where they would
# shadow the GPU machine's own for every program.
#
#   bench/bundle_perf.sh OUT.tar.xz
#
# The archive holds perf (the real ELF binary: Debian's /usr/bin/perf may be a
# wrapper script that picks perf_X.Y for the running kernel) and lib/ with
# every library ldd names but glibc, libstdc++ and libgcc_s (the GPU machine's
# are newer). Run it as `LD_LIBRARY_PATH=DIR/lib DIR/perf`.
set -euo pipefail
out=${1:?output archive}
perf=
for c in "$(command -v perf || true)" /usr/bin/perf_[0-9]* /usr/lib/linux-tools/*/perf /usr/lib/linux-tools-*/perf; do
  [[ -n $c && -x $c ]] || continue
  if file -bL "$c" | grep -q '^ELF'; then perf=$(readlink -f "$c"); break; fi
done
[[ -n $perf ]] || { echo "bundle_perf: no perf ELF binary found" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lib"
cp "$perf" "$tmp/perf"
ldd "$perf" | awk '/=> \//{print $1, $3}' | while read -r name path; do
  [[ $name =~ ^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libstdc\+\+|libgcc_s) ]] && continue
  cp -L "$path" "$tmp/lib/"
done
"$perf" --version > "$tmp/VERSION"
if command -v xz > /dev/null; then
  tar -C "$tmp" -cf - . | xz -6 -T0 > "$out.tmp"
else
  tar -C "$tmp" -czf "$out.tmp" .
fi
mv "$out.tmp" "$out"
echo "bundle_perf: $(cat "$tmp/VERSION") from $perf with $(ls "$tmp/lib" | wc -l) libraries: $out ($(du -h "$out" | cut -f1))"
