#!/usr/bin/env bash
# Frame-size measurement for `pkgfs pack` on the Linux source tree made by bench/pack.sh:
# archive size and pack time against the cost of reads through a mount (2,000 random
# files, then the whole tree), cold page cache each time. Prints a Markdown table.
#
#   bench/frames.sh [WORKDIR]        (default /var/tmp/pkgfs-bench)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/var/tmp/pkgfs-bench}
pkgfs="$here/target/release/pkgfs"
src="$work/linux"
[ -d "$src" ] || { echo "run bench/pack.sh first" >&2; exit 1; }
mnt="$work/mnt"; mkdir -p "$mnt"
(cd "$src" && find . -type f | sort | awk 'BEGIN{srand(42)} {print rand() "\t" $0}' | sort | sed -n '1,2000p' | cut -f2) > "$work/sample.txt"
now() { date +%s.%N; }
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
echo "| frame size | size (MB) | pack (s) | 2,000 random files, cold (s) | whole tree, cold (s) |"
echo "| --- | --- | --- | --- | --- |"
for fs in 64K 256K 1M 4M; do
  out="$work/frames-$fs.tar.zst"
  t0=$(now); "$pkgfs" pack "$src" -o "$out" --frame-size "$fs" >/dev/null 2>&1; t1=$(now)
  size=$(stat -c %s "$out")
  cold; "$pkgfs" mount "$out" "$mnt"
  t2=$(now); (cd "$mnt" && xargs -d '\n' cat < "$work/sample.txt" > /dev/null); t3=$(now)
  "$pkgfs" umount "$mnt"; cold; "$pkgfs" mount "$out" "$mnt"
  t4=$(now); tar -C "$mnt" -cf - . | cat > /dev/null; t5=$(now)
  "$pkgfs" umount "$mnt"
  printf '| %s | %.1f | %.1f | %.2f | %.2f |\n' "$fs" "$(echo "$size/1000000" | bc -l)" \
    "$(echo "$t1-$t0" | bc)" "$(echo "$t3-$t2" | bc)" "$(echo "$t5-$t4" | bc)"
done
