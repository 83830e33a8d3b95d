#!/usr/bin/env bash
# Pack benchmark on the Linux kernel source (Debian's linux-source-6.1): pkgfs pack
# throughput and archive sizes against zip -6, tar | zstd -19 and mksquashfs (zstd),
# plus mount time for ~600 per-directory packages. Prints a Markdown report.
#
#   bench/pack.sh [WORKDIR]      (default /var/tmp/pkgfs-bench; needs ~6 GB)
#
# Installs what it needs from Debian (linux-source-6.1, squashfs-tools, zip, zstd) and
# extracts the tree through bench/corpus.sh --tree-only.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/var/tmp/pkgfs-bench}
pkgfs="$here/target/release/pkgfs"
bash "$here/bench/corpus.sh" "$work" --tree-only
src="$work/linux"
files=$(find "$src" -type f | wc -l)
bytes=$(du -sb --apparent-size "$src" | cut -f1)
cores=$(nproc)

now() { date +%s.%N; }
elapsed() { echo "$2 - $1" | bc; }
mb() { echo "scale=1; $1 / 1000000" | bc; }

run() { # name, output file, command...
  local name=$1 out=$2; shift 2
  rm -f "$out"
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  local t0; t0=$(now)
  "$@" >/dev/null 2>&1
  local t1; t1=$(now)
  local secs; secs=$(elapsed "$t0" "$t1")
  local size; size=$(stat -c %s "$out")
  printf '| %s | %s | %.1f | %.1f | %.3f |\n' "$name" "$(mb "$size")" "$secs" \
    "$(echo "$bytes / 1000000 / $secs" | bc -l)" "$(echo "$size / $bytes" | bc -l)"
}

echo "## Pack: Linux 6.1 source, $files files, $(mb "$bytes") MB, $cores cores, $(date -u +%F)"
echo
echo "| tool | size (MB) | time (s) | throughput (MB/s of input) | size / input |"
echo "| --- | --- | --- | --- | --- |"
run "pkgfs pack --level 12 (default)" "$work/linux-12.tar.zst" "$pkgfs" pack "$src" -o "$work/linux-12.tar.zst"
run "pkgfs pack --level 19" "$work/linux-19.tar.zst" "$pkgfs" pack "$src" -o "$work/linux-19.tar.zst" --level 19
run "pkgfs pack --level 19 --frame-size 1M" "$work/linux-19-1m.tar.zst" "$pkgfs" pack "$src" -o "$work/linux-19-1m.tar.zst" --level 19 --frame-size 1M
run "zip -r -6" "$work/linux.zip" sh -c "cd '$src' && zip -q -r -6 '$work/linux.zip' ."
run "tar | zstd -19 -T0 (not seekable)" "$work/linux.tar.zst" sh -c "tar -C '$src' -cf - . | zstd -q -19 -T0 -o '$work/linux.tar.zst'"
run "mksquashfs -comp zstd" "$work/linux.sqfs" mksquashfs "$src" "$work/linux.sqfs" -comp zstd -quiet -no-progress

# ~600 packages, one per second-level directory (files above that level are left out:
# this part measures mount time).
pk="$work/pkgs-zst"
if [ ! -d "$pk" ]; then
  mkdir -p "$pk.tmp"
  (cd "$src" && find . -mindepth 2 -maxdepth 2 -type d | sed 's|^\./||') | while read -r d; do
    name=$(echo "$d" | tr / _)
    stage="$work/stage/$name"; rm -rf "$stage"; mkdir -p "$(dirname "$stage/$d")"
    cp -al "$src/$d" "$stage/$d" 2>/dev/null || cp -a "$src/$d" "$stage/$d"
    "$pkgfs" pack "$stage" -o "$pk.tmp/$name.tar.zst" --level 12 >/dev/null 2>&1
    rm -rf "$stage"
  done
  mv "$pk.tmp" "$pk"
fi
n=$(ls "$pk" | wc -l)
mkdir -p "$work/mnt"
times=()
for i in 1 2 3 4 5; do
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  t0=$(now); "$pkgfs" mount "$pk" "$work/mnt"; t1=$(now)
  times+=("$(elapsed "$t0" "$t1")")
  "$pkgfs" umount "$work/mnt"
done
echo
echo "## Mount: $n packages (one per second-level directory), cold page cache"
echo
echo "runs (s): ${times[*]}"
