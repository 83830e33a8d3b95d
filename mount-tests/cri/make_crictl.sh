#!/usr/bin/env bash
# crictl (kubernetes-sigs/cri-tools), the CRI client Kubernetes nodes are debugged with,
# for the test of `pkgfs store --cri-image-proxy`: it speaks the CRI image service as
# kubelet does, and `crictl pull --creds` sends a pull secret as kubelet sends an image
# pull secret. Debian does not package it; it is built from the Go module proxy.
#
#   mount-tests/cri/make_crictl.sh [OUTDIR]      (default: target/crictl)
#
# Prints the binary's path. Idempotent (a stamp in OUTDIR/.complete); concurrent runs
# wait on a lock.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${1:-$REPO/target/crictl}
CRICTL=sigs.k8s.io/cri-tools/cmd/crictl@v1.37.0
STAMP="pkgfs crictl v1 $CRICTL"
# shellcheck source=../lib/cached_build.sh
source "$HERE/../lib/cached_build.sh"
cached_build_begin crictl "$STAMP"

command -v go >/dev/null || { echo "make_crictl.sh: needs Go (the Go module proxy)" >&2; exit 1; }
GOBIN=$NEW/bin CGO_ENABLED=0 go install -trimpath -ldflags=-s "$CRICTL" >&2
cached_build_end
