#!/usr/bin/env bash
# The whole test suite, as the README's quick start runs it and CI runs it: installs the
# tools the tests call that this machine lacks (Debian packages; their services are not
# started: the tests start their own servers on loopback and stop them), then
# `cargo test` with any arguments given (`bash mount-tests/run.sh --test mount layouts`).
#
# Runs as root (FUSE mounts, apt-get). With PKGFS_TEST_STRICT=1 set here, a test that
# finds a tool or FUSE missing fails instead of skipping: nothing passes by not running.
set -euo pipefail
cd "$(dirname "$0")/.."

# tool:Debian package, for every external command the tests call. (The image fixtures'
# builder installs its own: umoci, skopeo, debootstrap, containerd, stargz-snapshotter.)
tools=(
  zip:zip unzip:unzip python3:python3 pigz:pigz bgzip:tabix script:bsdutils
  truncate:coreutils setfattr:attr getfattr:attr runc:runc man:man-db nginx:nginx
  fusermount3:fuse3 zstd:zstd tar:tar gzip:gzip useradd:passwd runuser:util-linux
  node:nodejs npm:npm docker-registry:docker-registry skopeo:skopeo htpasswd:apache2-utils
  openssl:openssl podman:podman ssh-keygen:openssh-client containerd:containerd ctr:containerd
)
need=()
for pair in "${tools[@]}"; do
  command -v "${pair%%:*}" >/dev/null || need+=("${pair##*:}")
done
if ((${#need[@]})); then
  echo "installing what the tests need: ${need[*]}" >&2
  policy=/usr/sbin/policy-rc.d
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

export PKGFS_TEST_STRICT=1
# The previous release's binary, for the test that reloads a mount from it to this one.
bash mount-tests/previous-release.sh >/dev/null
# A hang must fail with its output, not run into CI's limit: the whole run (build
# included) gets PKGFS_TEST_TIMEOUT, 50 minutes unless set.
exec timeout --kill-after=60 "${PKGFS_TEST_TIMEOUT:-50m}" cargo test "$@"
