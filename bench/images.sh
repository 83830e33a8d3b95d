#!/usr/bin/env bash
# The container-image benchmark's image, built once (issue "container images"):
#
#   bench/images.sh WORKDIR
#
# A Debian bookworm root with python3 (debootstrap --variant=minbase --include=python3,
# perl, about 200 MB uncompressed) made into a two-layer OCI image by umoci (gzip: the
# base, then python3's site of /usr/lib/python3* replaced wholesale as an app layer
# would), copied by skopeo to zstd:chunked. Output in WORKDIR/images: oci-gzip/,
# oci-zstd-chunked/ and done. Needs root; installs umoci, skopeo and debootstrap.
set -euo pipefail

WORK=${1:-/var/tmp/pkgfs-bench}
OUT=$WORK/images
[[ -f $OUT/done ]] && exit 0
for t in umoci skopeo debootstrap; do
  command -v "$t" >/dev/null || { apt-get update -qq && apt-get install -y -qq umoci skopeo debootstrap; break; }
done
rm -rf "$OUT" && mkdir -p "$OUT"
L=$OUT/oci-gzip B=$OUT/bundle
MIRROR=$(awk '$1 == "deb" && $3 == "bookworm" { print $2; exit }' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)
if [[ -z $MIRROR ]]; then
  MIRROR=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
fi
MIRROR=${MIRROR:-http://deb.debian.org/debian}
umoci init --layout "$L"
umoci new --image "$L:latest"
umoci config --image "$L:latest" --os linux --architecture amd64 --config.cmd /usr/bin/python3
umoci unpack --image "$L:latest" "$B" >/dev/null
debootstrap --variant=minbase --include=python3,perl bookworm "$B/rootfs" "$MIRROR" >"$OUT/debootstrap.log" 2>&1
rm -rf "$B"/rootfs/var/cache/apt/archives/*.deb "$B"/rootfs/var/lib/apt/lists/* "$B"/rootfs/dev/*
umoci repack --refresh-bundle --image "$L:latest" "$B"
# An application layer: python's library rewritten (as a pip install over a base does).
touch "$B"/rootfs/usr/lib/python3.11/*.py
echo 'pkgfs benchmark app layer' > "$B/rootfs/etc/app-release"
umoci repack --refresh-bundle --image "$L:latest" "$B"
rm -rf "$B"
skopeo copy --quiet --dest-compress-format zstd:chunked oci:"$L":latest oci:"$OUT/oci-zstd-chunked":latest
du -sb "$OUT"/oci-gzip/blobs "$OUT"/oci-zstd-chunked/blobs > "$OUT/sizes"
touch "$OUT/done"
