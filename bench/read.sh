#!/usr/bin/env bash
# Read benchmark against peers on the Linux source tree (prepared by bench/pack.sh):
# pkgfs over ~600 per-directory ZIP packages and ~600 pkgfs packages, squashfuse_ll and
# the kernel's squashfs on one zstd image, fuse-zip on one ZIP, and the extracted tree.
# Workloads: time to mount, `find` cold and warm, reading every file cold and warm.
# Prints a Markdown table.            bench/read.sh [WORKDIR]  (default /var/tmp/pkgfs-bench)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/var/tmp/pkgfs-bench}
pkgfs="$here/target/release/pkgfs"
src="$work/linux"
[ -d "$src" ] && [ -f "$work/linux.sqfs" ] && [ -f "$work/linux.zip" ] || { echo "run bench/pack.sh first" >&2; exit 1; }
need=()
command -v squashfuse_ll >/dev/null || need+=(squashfuse)
command -v fuse-zip >/dev/null || need+=(fuse-zip)
command -v fusermount3 >/dev/null || need+=(fuse3)
if ((${#need[@]})); then apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null; fi

# Split the whole tree into packages: one per second-level directory, plus one for the
# files of the first two levels, so every system serves the same 78,579 files.
split_into() { # kind dir
  local kind=$1 out=$2
  [ -d "$out" ] && return
  mkdir -p "$out.tmp"
  (cd "$src" && find . -type f -o -type l | sed 's|^\./||' | awk -F/ '{ if (NF >= 3) print $1"_"$2"\t"$0; else print "_top\t"$0 }') > "$work/split.tsv"
  cut -f1 "$work/split.tsv" | sort -u | while read -r pkg; do
    if [ "$kind" = zip ]; then
      (cd "$src" && awk -F'\t' -v p="$pkg" '$1==p {print $2}' "$work/split.tsv" | zip -q -6 -y -@ "$out.tmp/$pkg.zip")
    else
      stage="$work/stage"; rm -rf "$stage"; mkdir -p "$stage"
      awk -F'\t' -v p="$pkg" '$1==p {print $2}' "$work/split.tsv" | (cd "$src" && cpio -pdml --quiet "$stage")
      "$pkgfs" pack "$stage" -o "$out.tmp/$pkg.tar.zst" >/dev/null 2>&1
      rm -rf "$stage"
    fi
  done
  mv "$out.tmp" "$out"
}
split_into zip "$work/pkgs-zip-all"
split_into zst "$work/pkgs-zst-all"
[ -n "${PREPARE_ONLY:-}" ] && exit 0

mnt="$work/mnt"; mkdir -p "$mnt"
now() { date +%s.%N; }
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
t() { local t0; t0=$(now); "$@" >/dev/null 2>&1; echo "$(now) - $t0" | bc; }
find_all() { find "$mnt" -size +0 > /dev/null; }
read_all() { tar -C "$mnt" -cf - . | cat > /dev/null; }

row() { # name, mount command..., (unmount via umount -l)
  local name=$1; shift
  cold
  local tm; tm=$(t "$@")
  local f1 f2 r1 r2
  f1=$(t find_all); f2=$(t find_all)
  umount -l "$mnt" 2>/dev/null || true; cold; "$@" >/dev/null 2>&1
  r1=$(t read_all); r2=$(t read_all)
  umount -l "$mnt" 2>/dev/null || true
  sleep 0.5
  printf '| %s | %.3f | %.2f | %.2f | %.2f | %.2f |\n' "$name" "$tm" "$f1" "$f2" "$r1" "$r2"
}
bind_src() { mount --bind "$src" "$mnt"; }

echo "## Reads: Linux 6.1 source, $(find "$src" -type f | wc -l) files, $(nproc) cores, $(date -u +%F)"
echo
echo "| system | mount (s) | find, cold (s) | find, warm (s) | read all, cold (s) | read all, warm (s) |"
echo "| --- | --- | --- | --- | --- | --- |"
row "pkgfs, $(ls "$work/pkgs-zip-all" | wc -l) zip -6 packages" "$pkgfs" mount "$work/pkgs-zip-all" "$mnt"
row "pkgfs, $(ls "$work/pkgs-zst-all" | wc -l) pkgfs packages" "$pkgfs" mount "$work/pkgs-zst-all" "$mnt"
row "squashfuse_ll (zstd image)" squashfuse_ll "$work/linux.sqfs" "$mnt"
row "kernel squashfs (loop)" mount -t squashfs -o loop,ro "$work/linux.sqfs" "$mnt"
row "fuse-zip (one zip -6)" fuse-zip -r "$work/linux.zip" "$mnt"
row "extracted tree (bind mount)" bind_src
