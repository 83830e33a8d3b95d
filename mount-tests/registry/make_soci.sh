#!/usr/bin/env bash
# SOCI fixtures for the registry tests, made by AWS's own tool:
#
#   the soci CLI (awslabs/soci-snapshotter), built from the Go module proxy
#   ->  soci convert --standalone: the image fixtures' umoci image (gzip layers) made a
#       SOCI-enabled image (SOCI index manifest v2: an image index holding the image,
#       its manifest annotated with the SOCI index, and the SOCI index, one zTOC per
#       layer), as an OCI layout
#   ->  soci create + soci push (SOCI index manifest v1, as containerd users made them):
#       the image imported into a private containerd, indexed, and pushed with the index
#       to a private docker-registry (distribution 2.8: no referrers API, so soci's oras
#       client writes the referrers fallback tag `sha256-<manifest hex>`); that
#       registry's storage directory is kept (registry-v1/, repository pkgfs/soci1,
#       tag latest), for the tests to serve as it is
#
#   mount-tests/registry/make_soci.sh [OUTDIR [IMAGE_FIXTURES]]
#       (default: target/soci-fixtures, target/image-fixtures, which must exist)
#
# soci's cmd module has a `replace ../` directive, so `go install` refuses it: the root
# and cmd modules are downloaded at pinned versions (`go mod download`) and laid out as
# in the repository, then built with cgo (zlib). Idempotent (a stamp in OUTDIR/.complete),
# built in OUTDIR.new and renamed at the end; concurrent runs wait on a lock.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${1:-$REPO/target/soci-fixtures}
IMAGES=${2:-$REPO/target/image-fixtures}
SOCI_ROOT=github.com/awslabs/soci-snapshotter@v0.16.1
SOCI_CMD=github.com/awslabs/soci-snapshotter/cmd@v0.0.0-20260930233240-61147fe7c929
# 1 MiB spans (soci's default is 4 MiB): more spans in a small test image.
SPAN=1048576

[[ -f $IMAGES/.complete ]] || { echo "make_soci.sh: no image fixtures in $IMAGES" >&2; exit 1; }
STAMP="pkgfs soci fixtures v2 $SOCI_ROOT $SOCI_CMD $SPAN $(cat "$HERE/make_soci.sh" "$HERE/../images/containerd.sh" | sha256sum | cut -c1-16) $(cat "$IMAGES/.complete")"
complete() { [[ -f $OUT/.complete && $(<"$OUT/.complete") == "$STAMP" ]]; }
complete && exit 0
mkdir -p "$(dirname "$OUT")"
exec 9>"$OUT.lock"
flock 9
complete && exit 0

command -v go >/dev/null || { echo "make_soci.sh: needs Go (the Go module proxy)" >&2; exit 1; }
if ! dpkg -s zlib1g-dev >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zlib1g-dev >/dev/null
fi

NEW=$OUT.new
rm -rf "$NEW"
mkdir -p "$NEW/bin"
SRC=$NEW/src
dir_of() { go mod download -json "$1" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error")))'; }
root=$(dir_of "$SOCI_ROOT")
cmd=$(dir_of "$SOCI_CMD")
cp -r "$root" "$SRC"
chmod -R u+w "$SRC"
rm -rf "$SRC/cmd"
cp -r "$cmd" "$SRC/cmd"
chmod -R u+w "$SRC/cmd"
(cd "$SRC/cmd" && CGO_ENABLED=1 go build -o "$NEW/bin/soci" ./soci)
rm -rf "$SRC"

"$NEW/bin/soci" convert --standalone --format oci-dir --min-layer-size 0 \
  --span-size "$SPAN" "$IMAGES/oci-gzip" "$NEW/oci-gzip-soci" >"$NEW/convert.log"
rm -rf "$NEW/oci-gzip-soci/ingest"

# SOCI index manifest v1, pushed by soci itself.
WORK=$(mktemp -d /tmp/pkgfs-soci.XXXXXX)   # short: unix socket names are limited
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK" "${CTRD_DIR:-}"
}
trap cleanup EXIT
source "$HERE/../images/containerd.sh"
start_containerd
PIDS+=("$CTRD_PID")
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$WORK/registry.yml" <<CONF
version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: $NEW/registry-v1
http:
  addr: 127.0.0.1:$PORT
CONF
docker-registry serve "$WORK/registry.yml" >"$WORK/registry.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
  (echo >"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
  sleep 0.1
done
REF=127.0.0.1:$PORT/pkgfs/soci1:latest
skopeo copy --quiet --dest-tls-verify=false "oci:$IMAGES/oci-gzip:latest" "docker://$REF"
ctr -a "$CTRD_DIR/c.sock" -n pkgfs images import --no-unpack --base-name "127.0.0.1:$PORT/pkgfs/soci1" \
  "$IMAGES/oci-archive.tar" >/dev/null
SOCI=("$NEW/bin/soci" -a "$CTRD_DIR/c.sock" -n pkgfs --root "$WORK/soci")
"${SOCI[@]}" create --min-layer-size 0 --span-size "$SPAN" "$REF" >"$NEW/create-v1.log"
"${SOCI[@]}" push --plain-http "$REF" >"$NEW/push-v1.log"
cleanup
trap - EXIT

echo "$STAMP" >"$NEW/.complete"
rm -rf "$OUT"
mv "$NEW" "$OUT"
