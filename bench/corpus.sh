#!/usr/bin/env bash
# The benchmark corpus (issue 5), made from Debian's linux-source-6.1: the extracted tree,
# one zip, one squashfs image, one gzip tarball, and the tree cut into ~600 packages (one
# per second-level directory) as zip -6 archives, pkgfs packages and tar.gz (gzip -6). Installs what the benchmark needs
# (Debian packages; ratarmount and matplotlib from PyPI into target/bench-venv) and builds
# the release binary. Each piece is made once and kept.
#
#   bench/corpus.sh [WORKDIR] [--tree-only]
#
# WORKDIR defaults to /var/tmp/pkgfs-bench and needs ~10 GB. --tree-only stops after the
# extracted tree (what bench/pack.sh needs) and installs only what that and packing need.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/var/tmp/pkgfs-bench}
tree_only=${2:-}
pkgfs="$here/target/release/pkgfs"
mkdir -p "$work"

need=()
[ -f /usr/src/linux-source-6.1.tar.xz ] || need+=(linux-source-6.1)
tools="mksquashfs:squashfs-tools zip:zip zstd:zstd"
[ "$tree_only" = --tree-only ] || tools="$tools squashfuse_ll:squashfuse fuse-zip:fuse-zip
  fusermount3:fuse3 archivemount:archivemount cpio:cpio"
for t in $tools; do
  command -v "${t%%:*}" >/dev/null || need+=("${t##*:}")
done
if ((${#need[@]})); then apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null; fi
(cd "$here" && cargo build --release -q)

# The corpus: the tree, one zip, one squashfs image.
src="$work/linux"
if [ ! -d "$src" ]; then
  mkdir -p "$src.tmp" && tar -xJf /usr/src/linux-source-6.1.tar.xz -C "$src.tmp" --strip-components=1
  mv "$src.tmp" "$src"
fi
[ "$tree_only" = --tree-only ] && exit 0

venv="$here/target/bench-venv"
[ -x "$venv/bin/ratarmount" ] && "$venv/bin/python" -c 'import matplotlib' 2>/dev/null || {
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$here/bench/requirements.txt"
}
[ -f "$work/linux.zip" ] || { (cd "$src" && zip -q -r -6 -y "$work/linux.zip.tmp" .) && mv "$work/linux.zip.tmp" "$work/linux.zip"; }
[ -f "$work/linux.sqfs" ] || { mksquashfs "$src" "$work/linux.sqfs.tmp" -comp zstd -quiet -no-progress && mv "$work/linux.sqfs.tmp" "$work/linux.sqfs"; }

# The same tree as ~600 packages: one per second-level directory, plus one for the files
# of the first two levels, so every system serves the same files.
split_into() { # kind dir
  local kind=$1 out=$2
  [ -d "$out" ] && return
  rm -rf "$out.tmp"; mkdir -p "$out.tmp"
  (cd "$src" && find . -type f -o -type l | sed 's|^\./||' | awk -F/ '{ if (NF >= 3) print $1"_"$2"\t"$0; else print "_top\t"$0 }') > "$work/split.tsv"
  cut -f1 "$work/split.tsv" | sort -u | while read -r pkg; do
    if [ "$kind" = zip ]; then
      (cd "$src" && awk -F'\t' -v p="$pkg" '$1==p {print $2}' "$work/split.tsv" | zip -q -6 -y -@ "$out.tmp/$pkg.zip")
    elif [ "$kind" = targz ]; then
      # GNU tar, gzip -6, the same files as the zip (and, like it, no directory entries).
      (cd "$src" && awk -F'\t' -v p="$pkg" '$1==p {print $2}' "$work/split.tsv" | tar --no-recursion -cf - -T - | gzip -6 > "$out.tmp/$pkg.tar.gz")
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
split_into targz "$work/pkgs-targz-all"
# The whole tree as one gzip tarball (GNU tar, gzip -6): bench/targz.py.
[ -f "$work/linux.tar.gz" ] || { tar -C "$src" -cf - . | gzip -6 > "$work/linux.tar.gz.tmp" && mv "$work/linux.tar.gz.tmp" "$work/linux.tar.gz"; }
