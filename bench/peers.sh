#!/usr/bin/env bash
# The peer benchmark (issue 5): pkgfs against squashfuse_ll, kernel squashfs, fuse-zip,
# ratarmount, archivemount and the extracted tree on the Linux 6.1 source, plus pkgfs's
# scaling run; writes docs/bench/peers.json, docs/bench/peers.md and the plots in
# docs/img/. Installs what it needs (Debian packages; ratarmount and matplotlib from PyPI
# into target/bench-venv).          bench/peers.sh [WORKDIR] [peers.py options]
# WORKDIR defaults to /var/tmp/pkgfs-bench and needs ~10 GB.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/var/tmp/pkgfs-bench}
shift || true
bash "$here/bench/corpus.sh" "$work"
venv="$here/target/bench-venv"

mkdir -p "$here/docs/bench" "$here/docs/img"
python3 "$here/bench/peers.py" "$work" "$here/docs/bench/peers.json" "$@"
"$venv/bin/python" "$here/bench/report.py" "$here/docs/bench/peers.json" "$here/docs/bench/peers.md" "$here/docs/img"
cat "$here/docs/bench/peers.md"
