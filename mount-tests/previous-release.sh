#!/usr/bin/env bash
# Builds the previous release's pkgfs (the commit named in mount-tests/previous-release)
# for the test that reloads a mount from that binary to this one
# (restart.rs, reload_from_the_previous_release). Its source comes out of this clone's
# history; it is built into the same target directory, so the dependencies compiled for
# this build are reused and only pkgfs itself compiles (~30 s). The result is cached:
# target/prev-release/pkgfs-<commit>. Prints that path.
set -euo pipefail
cd "$(dirname "$0")/.."
commit=$(head -n1 mount-tests/previous-release)
out=target/prev-release/pkgfs-$commit
if [[ -x $out ]]; then
  echo "$out"
  exit 0
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "previous-release.sh: commit $commit is not in this clone's history" \
    "(a shallow clone?): fetch it, or clone without --depth" >&2
  exit 1
fi
src=target/prev-release/src-$commit
rm -rf "$src"
mkdir -p "$src"
git archive "$commit" Cargo.toml Cargo.lock src | tar -x -C "$src"
# Its own workspace, its binary under another name (so this build's target/debug/pkgfs
# stays), no benchmarks (their sources are not extracted).
python3 - "$src/Cargo.toml" <<'PY'
import re, sys
path = sys.argv[1]
text = open(path).read()
text = text.replace('[[bin]]\nname = "pkgfs"', '[[bin]]\nname = "pkgfs-prev"', 1)
text = re.sub(r'\n\[\[bench\]\][^\[]*', '\n', text)
open(path, 'w').write(text + '\n[workspace]\n')
PY
CARGO_INCREMENTAL=0 cargo build --quiet --manifest-path "$src/Cargo.toml" --target-dir target --bin pkgfs-prev
cp target/debug/pkgfs-prev "$out.tmp"
mv "$out.tmp" "$out"
rm -rf "$src" target/debug/pkgfs-prev target/debug/pkgfs-prev.d target/debug/deps/pkgfs_prev-*
echo "$out"
