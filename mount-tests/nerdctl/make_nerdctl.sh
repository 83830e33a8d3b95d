#!/usr/bin/env bash
# nerdctl (containerd/nerdctl), for the test that it pulls lazily through
# `pkgfs snapshotter` configured under a name it knows (docs/design/snapshotter.md,
# "Docker Engine and nerdctl"). Debian does not package it; it is built from the Go
# module proxy. Its go.mod has a `replace` (a test module of its repository), so
# `go install pkg@version` refuses it: the module's source is copied out of the module
# cache and built there, as its own Makefile builds it.
#
#   mount-tests/nerdctl/make_nerdctl.sh [OUTDIR]      (default: target/nerdctl)
#
# Prints the binary's path. Idempotent (a stamp in OUTDIR/.complete); concurrent runs
# wait on a lock.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${1:-$REPO/target/nerdctl}
# The newest v2 release the proxy serves whole (v2.4.2 needs a moby/moby/v2 beta it
# refuses); v2 speaks to Debian's containerd 1.6 for pulls.
MODULE=github.com/containerd/nerdctl/v2
VERSION=v2.0.5
STAMP="pkgfs nerdctl v1 $MODULE@$VERSION"
# shellcheck source=../lib/cached_build.sh
source "$HERE/../lib/cached_build.sh"
cached_build_begin nerdctl "$STAMP"

command -v go >/dev/null || { echo "make_nerdctl.sh: needs Go (the Go module proxy)" >&2; exit 1; }
dir=$(cd "$NEW" && go mod download -json "$MODULE@$VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
cp -r "$dir" "$NEW/src"
chmod -R u+w "$NEW/src"
(cd "$NEW/src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags=-s -o "$NEW/bin/nerdctl" ./cmd/nerdctl) >&2
rm -rf "$NEW/src"
cached_build_end
