#!/usr/bin/env bash
# Container-image fixtures for the mount tests, made by the real tools:
#
#   debootstrap --variant=minbase bookworm  ->  umoci: a 3-layer OCI image (oci-gzip)
#   ->  skopeo copy: zstd, zstd:chunked, gzip (re-encoded), oci-archive, docker-archive
#   ->  ctr-remote (stargz-snapshotter, via a private containerd): eStargz and a second
#       zstd:chunked writer
#   + a reference unpack (umoci unpack) and its listing, every copy checked against it
#   + quirks (real tool bugs) and hostile hand-made layouts (hostile.py)
#
#   mount-tests/images/make_images.sh [OUTDIR]      (default: target/image-fixtures)
#
# Runs as root on Debian 12; installs what it lacks with apt-get. Idempotent: OUTDIR/.complete
# holds a stamp (fixture version + hash of these scripts) and a later run with the same stamp
# returns at once; concurrent runs wait on a lock. Built in OUTDIR.new and renamed at the end.
# OUTDIR/README.txt describes the output; OUTDIR/fixtures.json is the machine-readable
# catalogue; OUTDIR/build-info.json has tool versions, timings and sizes.
#
# Environment: PKGFS_DEBIAN_MIRROR (default: the bookworm mirror in /etc/apt/sources*),
# PKGFS_IMAGES_ESTARGZ=0 skips the containerd/ctr-remote step (eStargz, second zstd:chunked).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=${1:-$REPO/target/image-fixtures}
OUT=$(mkdir -p "$(dirname "$OUT")" && cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")
SUITE=bookworm
FIXTURE_VERSION=1
ESTARGZ=${PKGFS_IMAGES_ESTARGZ:-1}
STAMP="pkgfs image fixtures v$FIXTURE_VERSION estargz=$ESTARGZ $(cat "$HERE/make_images.sh" "$HERE/hostile.py" "$HERE/ocitool.py" "$HERE/containerd.sh" | sha256sum | cut -c1-16)"

complete() { [[ -f $OUT/.complete && $(<"$OUT/.complete") == "$STAMP" ]]; }
complete && exit 0
exec 9>"$OUT.lock"
flock 9
complete && exit 0

if ((EUID != 0)); then
  echo "make_images.sh: needs root (debootstrap, chroot, mknod, setcap, chown)" >&2
  exit 1
fi

W=$OUT.work   # scratch, removed on success
NEW=$OUT.new  # the output being built
rm -rf "$W" "$NEW"
mkdir -p "$W" "$NEW"
START=$EPOCHREALTIME
CTRD_PID=     # our private containerd
CTRD_DIR=
BG_JOBS=()    # background steps (hostile.py, ctr-remote clients)
U=            # scratch for unpacks being compared: tmpfs if it keeps user xattrs, else $W
cleanup() {
  local rc=$? j
  for j in "${BG_JOBS[@]}"; do kill "$j" 2>/dev/null || true; done
  if [[ -n $CTRD_PID ]]; then kill "$CTRD_PID" 2>/dev/null || true; wait "$CTRD_PID" 2>/dev/null || true; fi
  [[ -n $CTRD_DIR ]] && rm -rf "$CTRD_DIR"
  [[ $U == /dev/shm/* ]] && rm -rf "$U"
  if ((rc != 0)); then echo "make_images.sh: failed (exit $rc); scratch left in $W" >&2; fi
}
trap cleanup EXIT

log() { printf '[make_images %6.1fs] %s\n' "$(elapsed "$START")" "$*" >&2; }
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
TIMES=()
background() {  # background NAME COMMAND...: run while the main line goes on; see join
  local name=$1
  shift
  (
    t0=$EPOCHREALTIME
    "$@" >"$W/bg-$name.log" 2>&1
    elapsed "$t0" >"$W/bg-$name.seconds"
  ) &
  BG_JOBS+=($!)
  printf -v "BG_${name//-/_}" %s $!
}
join() {  # join NAME: wait for a background step, fail with its log if it failed
  local var=BG_${1//-/_}
  local pid=${!var}
  if ! wait "$pid"; then
    tail -n 40 "$W/bg-$1.log" >&2
    echo "make_images.sh: background step $1 failed" >&2
    return 1
  fi
  local j rest=()
  for j in "${BG_JOBS[@]}"; do [[ $j == "$pid" ]] || rest+=("$j"); done
  BG_JOBS=("${rest[@]}")
  TIMES+=("$1=$(<"$W/bg-$1.seconds")")
  log "$1 (in the background) took $(<"$W/bg-$1.seconds")s"
}
timed() {  # timed NAME COMMAND...: run, log and record the wall time
  local name=$1 t0=$EPOCHREALTIME
  shift
  log "$name ..."
  "$@"
  TIMES+=("$name=$(elapsed "$t0")")
  log "$name done in $(elapsed "$t0")s"
}
quiet() {  # run a command, its output to a log shown only on failure
  local logf
  logf=$W/log.$RANDOM
  if ! "$@" >"$logf" 2>&1; then
    tail -n 40 "$logf" >&2
    echo "make_images.sh: failed: $*" >&2
    return 1
  fi
}
py() { python3 "$HERE/ocitool.py" "$@"; }
blob() { echo "$1/blobs/sha256/${2#sha256:}"; }                      # blob LAYOUT DIGEST
manifest_of() { blob "$1" "$(jq -r '.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == "'"${2:-latest}"'") | .digest' "$1/index.json")"; }
last_layer() { jq -r '.layers[-1].digest' "$(manifest_of "$1" "${2:-latest}")"; }

# ---------------------------------------------------------------- tools
install_tools() {
  local need=() pkgs
  want() { command -v "$1" >/dev/null 2>&1 || need+=("$2"); }
  want debootstrap debootstrap
  want umoci umoci
  want skopeo skopeo
  want setfattr attr
  want setcap libcap2-bin
  want jq jq
  want zstd zstd
  want python3 python3
  want gzip gzip
  [[ -r /usr/share/keyrings/debian-archive-keyring.gpg ]] || need+=(debian-archive-keyring)
  if [[ $ESTARGZ == 1 ]]; then
    want ctr-remote stargz-snapshotter
    want containerd containerd
  fi
  ((${#need[@]})) || return 0
  mapfile -t pkgs < <(printf '%s\n' "${need[@]}" | sort -u)
  log "apt-get install ${pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >"$W/apt.log" 2>&1; then
    quiet apt-get update -qq
    quiet apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
  fi
}

debian_mirror() {
  if [[ -n ${PKGFS_DEBIAN_MIRROR:-} ]]; then echo "$PKGFS_DEBIAN_MIRROR"; return; fi
  local uri
  # deb822 stanzas: the first enabled one whose Suites include $SUITE itself
  uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v RS= -v suite="$SUITE" '
    /(^|\n)Enabled:[ \t]*[Nn]o/ { next }
    { s = ""; u = ""; n = split($0, L, "\n")
      for (i = 1; i <= n; i++) { if (L[i] ~ /^Suites:/) s = L[i]; if (L[i] ~ /^URIs:/) u = L[i] }
      if ((" " s " ") ~ (" " suite " ") && u != "") {
        sub(/^URIs:[ \t]*/, "", u); split(u, U, /[ \t]+/); print U[1]; exit } }')
  if [[ -z $uri ]]; then  # one-line style: deb [opts] URI SUITE COMPONENTS
    uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk -v suite="$SUITE" '
      $1 == "deb" { i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                    if ($(i + 1) == suite) { print $i; exit } }')
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

# ---------------------------------------------------------------- layer 1: debootstrap
L=$NEW/oci-gzip        # the umoci-built image
B=$W/bundle            # umoci bundle; rootfs = B/rootfs
R=$B/rootfs

new_image() {
  umoci init --layout "$L"
  umoci new --image "$L:latest"
  umoci config --image "$L:latest" --no-history --author "pkgfs mount-tests" \
    --created 2024-01-01T00:00:00Z --os linux --architecture amd64 \
    --config.cmd /bin/sh --config.workingdir / \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.label org.opencontainers.image.title=pkgfs-debian-fixture
  umoci unpack --image "$L:latest" "$B" >/dev/null
}

debootstrap_root() {
  local keyring=()
  [[ -r /usr/share/keyrings/debian-archive-keyring.gpg ]] && keyring=(--keyring=/usr/share/keyrings/debian-archive-keyring.gpg)
  if ! debootstrap --variant=minbase "${keyring[@]}" "$SUITE" "$R" "$MIRROR" >"$W/debootstrap.log" 2>&1; then
    tail -n 40 "$W/debootstrap.log" >&2
    return 1
  fi
  ROOT_RAW_KB=$(du -sxk "$R" | cut -f1)
  ROOT_RAW_FILES=$(find "$R" -xdev | wc -l)
}

# What Debian's own slim images do: no package caches or lists, no translations, manual
# pages or info; an empty /dev (runtimes populate it); no host resolv.conf/hostname.
slim_root() {
  (
    cd "$R"
    rm -rf var/cache/apt/archives/*.deb var/cache/apt/*.bin var/lib/apt/lists/*
    rm -rf usr/share/locale/* usr/share/man/* usr/share/info/* dev/*
    rm -f etc/resolv.conf
    echo pkgfs-base >etc/hostname
    chmod 0644 etc/hostname
    cat >etc/dpkg/dpkg.cfg.d/pkgfs-slim <<'EOF'
# pkgfs test image: keep it small (as Debian's slim images do)
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
EOF
  )
  ROOT_KB=$(du -sxk "$R" | cut -f1)
  ROOT_FILES=$(find "$R" -xdev | wc -l)
  ROOT_PACKAGES=$(chroot "$R" dpkg-query -W -f '${Package}\n' | wc -l)
}

repack() {  # repack COMMENT: the bundle's changes become a new layer of L:latest
  umoci repack --refresh-bundle --image "$L:latest" --history.created_by "$1" "$B"
}

# ---------------------------------------------------------------- layer 2: the changes
layer2_changes() {
  cd "$R"
  # deletions: ~370 doc files (umoci writes ~310 whiteouts: one per wholly removed
  # directory, one per file otherwise), a whole tree, a file, a symlink, one name of a
  # lower-layer hard-link pair (usr/bin/perl and usr/bin/perl5.36.0 share an inode)
  find usr/share/doc -type f ! -name copyright -delete
  find usr/share/doc -depth -mindepth 1 -type d -empty -delete
  rm -rf usr/share/zoneinfo/right
  rm -f etc/motd etc/rmt usr/bin/perl5.36.0
  # changes to lower-layer files
  echo pkgfs-fixture >etc/hostname
  echo 'pkgfs:x:1234:5678:pkgfs test user:/srv/pkgfs:/bin/sh' >>etc/passwd
  echo 'pkgfs:x:5678:' >>etc/group
  rm -f etc/issue.net && ln -s issue etc/issue.net                # a file becomes a symlink
  # a directory removed and made again: umoci repack writes one whiteout per old child,
  # not an opaque marker (layer 3 has that)
  rm -rf etc/skel && mkdir etc/skel && echo 'made in layer 2' >etc/skel/README
  echo 'masked by the opaque directory of layer 3' >etc/default/pkgfs-layer2

  mkdir -p srv/pkgfs && cd srv/pkgfs
  printf 'hello\n' >hardlink-a
  ln hardlink-a hardlink-b                                         # two names, one inode
  mkdir sub && ln hardlink-a sub/hardlink-c                        # ... and a third elsewhere
  printf 'x\n' >xattr-file && setfattr -n user.pkgfs.test -v hello xattr-file
  mkdir xattr-dir && setfattr -n user.pkgfs.dir -v 1 xattr-dir
  cp ../../usr/bin/true cap-true && setcap cap_net_raw+ep cap-true  # security.capability
  cp ../../usr/bin/true setuid-true && chmod 4755 setuid-true
  cp ../../usr/bin/true setgid-true && chmod 2755 setgid-true
  mkdir sticky && chmod 1777 sticky
  mkfifo fifo
  mknod null c 1 3
  echo owned >owned && chown 1234:5678 owned && chmod 0640 owned
  mkdir owned-dir && echo inside >owned-dir/file && chown -R 1234:5678 owned-dir
  ln -s ../../etc/os-release symlink-rel
  ln -s /etc/os-release symlink-abs
  ln -s does-not-exist symlink-dangling
  ln -s sub symlink-dir
  ln -s ../../../../../../etc/passwd symlink-up                     # resolves to /etc/passwd inside the root
  : >empty-file && mkdir empty-dir
  echo 'unicode name' >'ünïcødé ☃ name.txt'
  local long
  long=$(printf 'long-name-%.0s' {1..15})                          # 150 bytes: PAX path
  echo long >"$long"
  ln -s "$(printf 'd%.0s/' {1..60})target" symlink-long-target       # 127 bytes: PAX linkpath
  # 5 MiB: random, zeros, random (zstd:chunked chunks, "zeros" chunks; two eStargz
  # chunks of ctr-remote's 4 MiB, the last of which its table gives no size)
  { head -c 2M /dev/urandom; head -c 1M /dev/zero; head -c 2M /dev/urandom; } >big.bin
  cat >../../usr/local/bin/pkgfs-selftest <<'EOF'
#!/bin/sh
# Run inside the image (chroot MOUNTPOINT /usr/local/bin/pkgfs-selftest): prints facts a
# test can compare, exits non-zero if the image looks wrong.
set -eu
. /etc/os-release
echo "os=$ID $VERSION_CODENAME"
echo "packages=$(dpkg-query -W -f '${Package}\n' | wc -l)"
echo "dpkg=$(dpkg-query -W -f '${Version}' dpkg)"
echo "hostname=$(cat /etc/hostname)"
echo "hardlink=$(cat /srv/pkgfs/sub/hardlink-c)"
test ! -e /etc/motd
test ! -e /etc/default/pkgfs-layer2
test -f /etc/default/pkgfs
test -x /usr/bin/perl
echo ok
EOF
  chmod 0755 ../../usr/local/bin/pkgfs-selftest
  cd /
}

# ---------------------------------------------------------------- layer 3: opaque dir
# umoci repack never writes .wh..wh..opq; umoci insert --opaque does, but umoci 0.4.7's
# insert leaves out the tar end-of-archive (opencontainers/umoci#436, fixed by PR #534 after
# 0.4.7): the layer ends right after the last file's data. GNU tar and Python's tarfile
# reject that. Here the end (padding to 512 + two zero blocks) is restored and the fixed tar
# added with `umoci raw add-layer`; quirks/umoci-insert keeps the unrepaired form.
layer3_opaque() {
  local src=$W/opaque-src d size
  mkdir -p "$src/sub"
  echo 'the only file of /etc/default (layer 3, opaque)' >"$src/pkgfs"
  echo deeper >"$src/sub/file"
  umoci insert --image "$L:latest" --tag insert-raw --opaque "$src" /etc/default
  d=$(last_layer "$L" insert-raw)
  gzip -dc "$(blob "$L" "$d")" >"$W/layer3.tar"
  size=$(stat -c %s "$W/layer3.tar")
  if ! tar -tf "$W/layer3.tar" >/dev/null 2>&1; then
    head -c $(((512 - size % 512) % 512 + 1024)) /dev/zero >>"$W/layer3.tar"
    LAYER3_REPAIRED=true
  else
    LAYER3_REPAIRED=false
  fi
  tar -tf "$W/layer3.tar" >/dev/null
  umoci raw add-layer --image "$L:latest" \
    --history.created_by "umoci insert --opaque SRC /etc/default (tar end-of-archive restored)" "$W/layer3.tar"
  umoci rm --image "$L:insert-raw"
  umoci gc --layout "$L"
}

build_base() {
  timed tools install_tools
  background hostile python3 "$HERE/hostile.py" "$NEW/hostile"
  MIRROR=$(debian_mirror)
  log "mirror $MIRROR"
  new_image
  timed debootstrap debootstrap_root
  slim_root
  timed layer1-repack repack "debootstrap --variant=minbase $SUITE (slimmed)"
  timed layer2 layer2_changes
  timed layer2-repack repack "pkgfs fixture changes"
  timed layer3 layer3_opaque
}

# ---------------------------------------------------------------- reference unpack
reference() {
  umoci unpack --image "$L:latest" "$NEW/reference" >/dev/null
  py tree "$NEW/reference/rootfs" >"$NEW/reference.tree"
  chroot "$NEW/reference/rootfs" /usr/local/bin/pkgfs-selftest >"$NEW/reference.selftest"
  chroot "$NEW/reference/rootfs" dpkg -l >"$NEW/reference.dpkg-l"
}

# ---------------------------------------------------------------- skopeo copies
SKOPEO=(skopeo --insecure-policy copy -q)
skopeo_copies() {
  "${SKOPEO[@]}" "oci:$L:latest" "oci-archive:$NEW/oci-archive.tar:latest"
  "${SKOPEO[@]}" "oci:$L:latest" "docker-archive:$NEW/docker-archive.tar:pkgfs/debian:latest"
  if [[ $ESTARGZ == 1 ]]; then
    # single-threaded converters: run beside skopeo's (single-threaded) zstd:chunked
    start_containerd
    background ctr-remote ctr_convert
  fi
  "${SKOPEO[@]}" --dest-compress-format zstd "oci:$L:latest" "oci:$NEW/oci-zstd:latest"
  # skopeo 1.9.3 hangs (no error) if a layer is not a complete tar: keep a time limit
  timeout 600 "${SKOPEO[@]}" --dest-compress-format zstd:chunked "oci:$L:latest" "oci:$NEW/oci-zstd-chunked:latest"
  # gzip -> gzip keeps umoci's blobs byte for byte (checked below); from zstd, skopeo
  # encodes its own gzip
  "${SKOPEO[@]}" --dest-compress-format gzip "oci:$NEW/oci-zstd:latest" "oci:$NEW/oci-gzip-skopeo:latest"
  "${SKOPEO[@]}" "oci:$L:latest" "oci:$W/plain-copy:latest"
  GZIP_COPY_SAME_BLOBS=true
  local d
  for d in $(jq -r '.layers[].digest' "$(manifest_of "$L")"); do
    [[ -f $(blob "$W/plain-copy" "$d") ]] || GZIP_COPY_SAME_BLOBS=false
  done
  rm -rf "$W/plain-copy"
}

# ---------------------------------------------------------------- eStargz (ctr-remote)
# start_containerd: containerd.sh (shared with registry/make_soci.sh)
source "$HERE/containerd.sh"

ctr_convert() {  # runs in a subshell (background); containerd belongs to the main shell
  local C=(ctr-remote -a "$CTRD_DIR/c.sock" -n pkgfs) p1 p2 name
  quiet "${C[@]}" images import --no-unpack --base-name pkgfs/src "$NEW/oci-archive.tar"
  # the two conversions in parallel (gzip level 9 dominates)
  quiet "${C[@]}" images convert --oci --estargz pkgfs/src:latest pkgfs/estargz:latest &
  p1=$!
  quiet "${C[@]}" images convert --oci --zstdchunked pkgfs/src:latest pkgfs/zstdchunked:latest &
  p2=$!
  wait "$p1"
  wait "$p2"
  for name in estargz zstdchunked; do
    quiet "${C[@]}" images export --skip-manifest-json "$CTRD_DIR/$name.tar" "pkgfs/$name:latest"
  done
  mkdir "$NEW/oci-estargz" "$NEW/oci-zstd-chunked-ctr"
  tar -xf "$CTRD_DIR/estargz.tar" -C "$NEW/oci-estargz"
  tar -xf "$CTRD_DIR/zstdchunked.tar" -C "$NEW/oci-zstd-chunked-ctr"
}

stop_containerd() {
  kill "$CTRD_PID"
  wait "$CTRD_PID" || true
  CTRD_PID=
  rm -rf "$CTRD_DIR"
  CTRD_DIR=
}

# ---------------------------------------------------------------- verification
VERIFY=()
pick_scratch() {
  local free_kb
  free_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }')
  if ((${free_kb:-0} > 2 * 1024 * 1024)) && U=$(mktemp -d /dev/shm/pkgfs-images.XXXXXX 2>/dev/null); then
    if touch "$U/probe" && setfattr -n user.probe -v 1 "$U/probe" 2>/dev/null; then
      rm -f "$U/probe"
      return
    fi
    rm -rf "$U"
  fi
  U=$W/scratch
  mkdir -p "$U"
}

unpack_compare() {  # unpack_compare NAME LAYOUT [--ignore NAME]...: umoci unpack == reference
  local name=$1 layout=$2
  shift 2
  umoci unpack --image "$layout:latest" "$U/u-$name" >/dev/null
  py tree "$U/u-$name/rootfs" "$@" >"$U/$name.tree"
  if ! diff -u "$NEW/reference.tree" "$U/$name.tree" >"$NEW/verify/$name.diff"; then
    echo "make_images.sh: the unpack of $name differs from the reference:" >&2
    head -n 40 "$NEW/verify/$name.diff" >&2
    return 1
  fi
  rm -f "$NEW/verify/$name.diff"
  rm -rf "$U/u-$name" "$U/$name.tree"
  VERIFY+=("$name: umoci unpack identical to the reference${1:+ (apart from the eStargz TOC/landmark files)}")
}

verify_all() {
  mkdir -p "$NEW/verify"
  local n
  pick_scratch
  # byte level: blobs match descriptors, layers decompress to the config's diff_ids, and
  # every skopeo copy decompresses to the very same tar streams as the umoci image
  py check "$L" >"$NEW/verify/oci-gzip.json"
  for n in oci-zstd oci-zstd-chunked oci-gzip-skopeo; do
    py check "$NEW/$n" --same-layers-as "$L" >"$NEW/verify/$n.json"
    VERIFY+=("$n: every layer decompresses to the same tar stream as oci-gzip (diff_ids equal)")
  done
  mkdir "$W/oci-archive"
  tar -xf "$NEW/oci-archive.tar" -C "$W/oci-archive"
  py check "$W/oci-archive" --same-layers-as "$L" >"$NEW/verify/oci-archive.json"
  VERIFY+=("oci-archive: same tar streams as oci-gzip")
  py check-docker-archive "$NEW/docker-archive.tar" >"$NEW/verify/docker-archive.json"
  if [[ $(jq -c '[.layers[].diff_id]' "$NEW/verify/docker-archive.json") != "$(jq -c '[.layers[].diff_id]' "$NEW/verify/oci-gzip.json")" ]]; then
    echo "make_images.sh: docker-archive layers differ from oci-gzip's" >&2
    return 1
  fi
  VERIFY+=("docker-archive: layer tars are the same tar streams as oci-gzip")
  # file level: real unpacks compared with the reference listing. The copies above are
  # byte-identical tar streams, so two stand for them: zstd:chunked (umoci 0.4.7 cannot read
  # zstd: unpacked from a copy with the layers decompressed by the zstd CLI) and
  # docker-archive (back to OCI by skopeo)
  py plain "$NEW/oci-zstd-chunked" "$U/plain-oci-zstd-chunked"
  unpack_compare oci-zstd-chunked "$U/plain-oci-zstd-chunked"
  "${SKOPEO[@]}" "docker-archive:$NEW/docker-archive.tar" "oci:$U/docker-archive:latest"
  unpack_compare docker-archive "$U/docker-archive"
  rm -rf "$W/oci-archive" "$U/docker-archive" "$U/plain-oci-zstd-chunked"
  if [[ $ESTARGZ == 1 ]]; then
    # the converters rewrite the tar streams (new diff_ids) and add landmark/TOC entries
    py check "$NEW/oci-estargz" >"$NEW/verify/oci-estargz.json"
    py check "$NEW/oci-zstd-chunked-ctr" >"$NEW/verify/oci-zstd-chunked-ctr.json"
    unpack_compare oci-estargz "$NEW/oci-estargz" --ignore stargz.index.json \
      --ignore .prefetch.landmark --ignore .no.prefetch.landmark
    py plain "$NEW/oci-zstd-chunked-ctr" "$U/plain-ctr"
    unpack_compare oci-zstd-chunked-ctr "$U/plain-ctr" --ignore stargz.index.json \
      --ignore .prefetch.landmark --ignore .no.prefetch.landmark
    rm -rf "$U/plain-ctr"
  fi
  # the zstd:chunked TOCs: footer, annotations and the digest of every file in layers 2, 3
  python3 "$HERE/dump_toc.py" "$NEW/oci-zstd-chunked" --layer 1 --verify --entries 0 >"$NEW/verify/oci-zstd-chunked.toc-layer2.json"
  python3 "$HERE/dump_toc.py" "$NEW/oci-zstd-chunked" --layer 2 --verify --entries 0 >"$NEW/verify/oci-zstd-chunked.toc-layer3.json"
  if [[ $ESTARGZ == 1 ]]; then
    python3 "$HERE/dump_toc.py" "$NEW/oci-zstd-chunked-ctr" --layer 1 --verify --entries 0 >"$NEW/verify/oci-zstd-chunked-ctr.toc-layer2.json"
    python3 "$HERE/dump_toc.py" "$NEW/oci-estargz" --layer 1 --verify --entries 0 >"$NEW/verify/oci-estargz.toc-layer2.json"
  fi
  local which=zstd:chunked
  [[ $ESTARGZ == 1 ]] && which="zstd:chunked and eStargz"
  VERIFY+=("$which TOCs: footers, annotations and the file digests of the small layers checked by dump_toc.py --verify")
}

# ---------------------------------------------------------------- quirks
quirks() {
  local q=$NEW/quirks d b t
  mkdir -p "$q"
  # 1. umoci-insert: every layer made by `umoci insert` (0.4.7) lacks the tar end
  t=$W/quirk-insert
  mkdir -p "$t/src1/sub" "$t/src2"
  echo old >"$t/src1/old" && echo old >"$t/src1/sub/deep" && echo keep >"$t/src1/keep"
  echo new >"$t/src2/new" && echo keep2 >"$t/src2/keep"
  umoci init --layout "$q/umoci-insert"
  umoci new --image "$q/umoci-insert:latest"
  umoci insert --image "$q/umoci-insert:latest" "$t/src1" /data
  umoci insert --image "$q/umoci-insert:latest" --opaque "$t/src2" /data
  umoci insert --image "$q/umoci-insert:latest" --whiteout /data/keep
  umoci unpack --image "$q/umoci-insert:latest" "$t/unpacked" >/dev/null
  py tree "$t/unpacked/rootfs" >"$q/umoci-insert.tree"
  INSERT_TAR_END_MISSING=false
  for d in $(jq -r '.layers[].digest' "$(manifest_of "$q/umoci-insert")"); do
    gzip -dc "$(blob "$q/umoci-insert" "$d")" | tar -tf - >/dev/null 2>&1 || INSERT_TAR_END_MISSING=true
  done
  # 2. skopeo-mislabelled: docker-archive -> oci with --dest-oci-accept-uncompressed-layers
  #    stores plain tars but labels them tar+gzip (containers/image#1270)
  umoci init --layout "$t/tiny"
  umoci new --image "$t/tiny:latest"
  umoci unpack --image "$t/tiny:latest" "$t/tiny-b" >/dev/null
  mkdir -p "$t/tiny-b/rootfs/etc" && echo tiny >"$t/tiny-b/rootfs/etc/hostname" && echo hi >"$t/tiny-b/rootfs/hello.txt"
  umoci repack --image "$t/tiny:latest" "$t/tiny-b"
  "${SKOPEO[@]}" "oci:$t/tiny:latest" "docker-archive:$t/tiny.tar:pkgfs/tiny:latest"
  "${SKOPEO[@]}" --dest-oci-accept-uncompressed-layers "docker-archive:$t/tiny.tar" "oci:$q/skopeo-mislabelled:latest"
  b=$(blob "$q/skopeo-mislabelled" "$(last_layer "$q/skopeo-mislabelled")")
  MISLABELLED=false
  [[ $(jq -r '.layers[-1].mediaType' "$(manifest_of "$q/skopeo-mislabelled")") == *gzip && $(head -c 2 "$b" | od -An -tx1 | tr -d ' ') != 1f8b ]] && MISLABELLED=true
  umoci unpack --image "$t/tiny:latest" "$t/tiny-u" >/dev/null
  py tree "$t/tiny-u/rootfs" >"$q/skopeo-mislabelled.tree"
}

# ---------------------------------------------------------------- catalogue
layout_summary() {  # layout_summary NAME: one fixtures.json entry from verify/NAME.json
  jq --arg name "$1" --arg how "$2" '{($name): {path: $name, tag: "latest", made_by: $how,
      index_manifests, platform, manifest_mediaType, config_mediaType,
      layers: [.layers[] | {mediaType, size, uncompressed, digest, diff_id, annotations}]}}' "$NEW/verify/$1.json"
}

catalogue() {
  local parts=()
  parts+=("$(layout_summary oci-gzip "debootstrap + umoci repack (layers 1, 2) + umoci insert --opaque, end restored, via umoci raw add-layer (layer 3)")")
  parts+=("$(layout_summary oci-zstd "skopeo copy --dest-compress-format zstd oci:oci-gzip")")
  parts+=("$(layout_summary oci-zstd-chunked "skopeo copy --dest-compress-format zstd:chunked oci:oci-gzip")")
  parts+=("$(layout_summary oci-gzip-skopeo "skopeo copy --dest-compress-format gzip oci:oci-zstd (re-encoded by skopeo)")")
  parts+=("$(jq '{"oci-archive.tar": {path: "oci-archive.tar", transport: "oci-archive", tag: "latest", made_by: "skopeo copy oci:oci-gzip oci-archive:", layers: [.layers[] | {mediaType, size, digest, diff_id}]}}' "$NEW/verify/oci-archive.json")")
  parts+=("$(jq '{"docker-archive.tar": {path: "docker-archive.tar", transport: "docker-archive", repo_tags, made_by: "skopeo copy oci:oci-gzip docker-archive:", layers}}' "$NEW/verify/docker-archive.json")")
  if [[ $ESTARGZ == 1 ]]; then
    parts+=("$(layout_summary oci-estargz "ctr-remote image convert --oci --estargz (stargz-snapshotter)")")
    parts+=("$(layout_summary oci-zstd-chunked-ctr "ctr-remote image convert --oci --zstdchunked (stargz-snapshotter)")")
  fi
  printf '%s\n' "${parts[@]}" | jq -s --argjson insert_end_missing "$INSERT_TAR_END_MISSING" \
    --argjson mislabelled "$MISLABELLED" --argjson layer3_repaired "$LAYER3_REPAIRED" '{
      images: add,
      reference: {bundle: "reference", rootfs: "reference/rootfs", listing: "reference.tree",
        selftest_output: "reference.selftest", made_by: "umoci unpack --image oci-gzip:latest reference",
        listing_format: "ocitool.py tree: path, type, mode, uid:gid, size, sha256|-> target|major,minor, mtime (not for dirs), xattrs, link=first name of the hard-link group"},
      quirks: {
        "umoci-insert": {path: "quirks/umoci-insert", listing: "quirks/umoci-insert.tree",
          flaw: "layers written by umoci 0.4.7 insert end right after the last file data (no padding, no end-of-archive blocks); umoci and Go readers accept them, GNU tar and Python tarfile do not",
          tar_end_missing: $insert_end_missing},
        "skopeo-mislabelled": {path: "quirks/skopeo-mislabelled", listing: "quirks/skopeo-mislabelled.tree",
          flaw: "layers are plain tar but their media type says tar+gzip (containers/image#1270)",
          mislabelled: $mislabelled}},
      hostile: "hostile/cases.json",
      oci_gzip_layer3_end_restored: $layer3_repaired}' >"$NEW/fixtures.json"
}

build_info() {
  local sizes=() f
  for f in "$NEW"/*; do sizes+=("$(basename "$f")=$(du -sb "$f" | cut -f1)"); done
  jq -n --arg mirror "$MIRROR" --arg suite "$SUITE" \
    --arg umoci "$(umoci --version)" --arg skopeo "$(skopeo --version)" \
    --arg debootstrap "$(dpkg-query -W -f '${Version}' debootstrap)" \
    --arg ctr_remote "$( [[ $ESTARGZ == 1 ]] && dpkg-query -W -f 'stargz-snapshotter ${Version}' stargz-snapshotter || echo skipped)" \
    --arg containerd "$( [[ $ESTARGZ == 1 ]] && dpkg-query -W -f '${Version}' containerd || echo skipped)" \
    --arg zstd "$(zstd --version)" --arg python "$(python3 --version)" \
    --argjson raw_kb "$ROOT_RAW_KB" --argjson raw_files "$ROOT_RAW_FILES" \
    --argjson kb "$ROOT_KB" --argjson files "$ROOT_FILES" --argjson packages "$ROOT_PACKAGES" \
    --argjson gzip_copy_same "$GZIP_COPY_SAME_BLOBS" \
    --arg times "$(printf '%s\n' "${TIMES[@]}")" --arg sizes "$(printf '%s\n' "${sizes[@]}")" \
    --arg verify "$(printf '%s\n' "${VERIFY[@]}")" '
    def kv: split("\n") | map(select(length > 0) | split("=") | {(.[0]): (.[1] | tonumber)}) | add;
    {suite: $suite, mirror: $mirror,
     versions: {umoci: $umoci, skopeo: $skopeo, debootstrap: $debootstrap, ctr_remote: $ctr_remote,
                containerd: $containerd, zstd: $zstd, python: $python},
     rootfs: {debootstrap_kb: $raw_kb, debootstrap_entries: $raw_files, slimmed_kb: $kb,
              slimmed_entries: $files, packages: $packages},
     skopeo_gzip_to_gzip_keeps_blobs: $gzip_copy_same,
     seconds: ($times | kv), bytes: ($sizes | kv), verified: ($verify | split("\n") | map(select(length > 0)))}' \
    >"$NEW/build-info.json"
}

readme() {
  cat >"$NEW/README.txt" <<'EOF'
Container-image fixtures made by mount-tests/images/make_images.sh (see fixtures.json,
build-info.json). All OCI layouts have one manifest tagged "latest" (index.json, no
platform list). The image: Debian bookworm minbase (debootstrap), 3 layers:
  1  the root (slimmed: no apt lists/caches, locales, man/info pages; empty /dev)
  2  ~320 whiteouts (usr/share/doc except copyrights, usr/share/zoneinfo/right, etc/motd,
     etc/rmt, usr/bin/perl5.36.0 = one name of a hard-link pair, so usr/bin/perl is
     re-emitted whole), per-file whiteouts for the re-made etc/skel, changed etc/passwd,
     etc/group, etc/hostname, etc/issue.net (file -> symlink), etc/default/pkgfs-layer2,
     and srv/pkgfs/: hard links, user xattrs, security.capability,
     setuid/setgid/sticky, fifo, char device 1,3, uid/gid 1234:5678, symlinks (relative,
     absolute, dangling, to a dir, ../.. past the root, long target), a unicode name, a
     150-byte name, big.bin (4 MiB: random, zeros, random), /usr/local/bin/pkgfs-selftest
  3  etc/default/.wh..wh..opq + new etc/default content (umoci insert --opaque)

  oci-gzip/               umoci (the source of all others)
  oci-zstd/               skopeo --dest-compress-format zstd
  oci-zstd-chunked/       skopeo --dest-compress-format zstd:chunked (TOC: dump_toc.py)
  oci-gzip-skopeo/        skopeo, gzip re-encoded from oci-zstd
  oci-archive.tar         skopeo oci-archive:
  docker-archive.tar      skopeo docker-archive: (uncompressed layer tars), pkgfs/debian:latest
  oci-estargz/            ctr-remote --estargz (adds stargz.index.json, .no.prefetch.landmark)
  oci-zstd-chunked-ctr/   ctr-remote --zstdchunked (other TOC flavour, adds the landmark)
                          (these two not with PKGFS_IMAGES_ESTARGZ=0)
  reference/rootfs        umoci unpack of oci-gzip; reference.tree its listing
  verify/                 what was checked (all copies unpack to the reference)
  quirks/                 real tool bugs: umoci-insert (no tar end), skopeo-mislabelled
  hostile/                hand-made broken layouts (hostile.py; cases.json)
EOF
}

# ---------------------------------------------------------------- main
build_base
timed reference reference
timed skopeo skopeo_copies
if [[ $ESTARGZ == 1 ]]; then
  join ctr-remote
  stop_containerd
fi
timed verify verify_all
timed quirks quirks
join hostile
catalogue
readme
TIMES+=("total=$(elapsed "$START")")
build_info
sed -i "s|$NEW/|$OUT/|g" "$NEW"/verify/*.json   # paths as they will be after the rename
echo "$STAMP" >"$NEW/.complete"
rm -rf "$OUT" "$W"
[[ $U == /dev/shm/* ]] && rm -rf "$U"
mv "$NEW" "$OUT"
log "done: $OUT ($(du -sh "$OUT" | cut -f1))"
