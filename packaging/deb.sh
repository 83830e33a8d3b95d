#!/usr/bin/env bash
# Build the Debian package of pkgfs from this checkout, with dpkg-deb alone:
#
#   packaging/deb.sh [--binary PATH] [OUTDIR]      (default: a release build, target/debian)
#
# The package holds /usr/bin/pkgfs, the mount(8) helper /usr/sbin/mount.fuse.pkgfs (a
# link to it: fstab lines and systemd mount units of type fuse.pkgfs work), man pages
# and bash, zsh and fish completions generated from the binary's own definitions (so
# they never drift from --help), the README, the example fstab line and systemd mount
# unit. It depends on fuse3 (fusermount3, for mounts by users other than root). Its
# postinst reloads every pkgfs mount after an upgrade. Prints the path of the .deb it
# wrote.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=
if [[ ${1:-} == --binary ]]; then
  BIN=$2
  shift 2
fi
OUT=${1:-$HERE/target/debian}
if [[ -z $BIN ]]; then
  (cd "$HERE" && cargo build --release --quiet)
  BIN=$HERE/target/release/pkgfs
fi
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$HERE/Cargo.toml" | head -1)
ARCH=$(dpkg --print-architecture)
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
R=$STAGE/root
install -D -m 0755 "$BIN" "$R/usr/bin/pkgfs"
strip --strip-unneeded "$R/usr/bin/pkgfs" 2>/dev/null || true
mkdir -p "$R/usr/sbin"
ln -s ../bin/pkgfs "$R/usr/sbin/mount.fuse.pkgfs"
"$R/usr/bin/pkgfs" manpages "$STAGE/man" 2>/dev/null
install -d "$R/usr/share/man/man1"
for page in "$STAGE"/man/*.1; do
  gzip -9n < "$page" > "$R/usr/share/man/man1/$(basename "$page").gz"
done
install -d "$R/usr/share/bash-completion/completions" "$R/usr/share/zsh/vendor-completions" \
  "$R/usr/share/fish/vendor_completions.d"
"$R/usr/bin/pkgfs" completions bash > "$R/usr/share/bash-completion/completions/pkgfs"
"$R/usr/bin/pkgfs" completions zsh > "$R/usr/share/zsh/vendor-completions/_pkgfs"
"$R/usr/bin/pkgfs" completions fish > "$R/usr/share/fish/vendor_completions.d/pkgfs.fish"
D=$R/usr/share/doc/pkgfs
install -D -m 0644 "$HERE/README.md" "$D/README.md"
install -D -m 0644 "$HERE/docs/examples/fstab" "$D/examples/fstab"
install -D -m 0644 "$HERE/docs/examples/srv-pkgs.mount" "$D/examples/srv-pkgs.mount"
cat > "$D/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: pkgfs
Comment: the project has not chosen a license yet; this file will name it.

Files: *
Copyright: the pkgfs authors
EOF
install -d "$R/DEBIAN"
SIZE=$(du -sk --exclude=DEBIAN "$R" | cut -f1)
cat > "$R/DEBIAN/control" <<EOF
Package: pkgfs
Version: $VERSION
Architecture: $ARCH
Maintainer: pkgfs developers <pkgfs@localhost>
Depends: fuse3, libc6
Section: admin
Priority: optional
Installed-Size: $SIZE
Description: read-only FUSE filesystem of package archives, merged, never extracted
 pkgfs mounts a directory of package archives (ZIP, wheels, jars, gzip, zstd and
 plain tarballs, pkgfs packages) and container images (OCI layouts, oci-archives,
 docker-archives) as one merged read-only tree, reading each archive in place.
 Packages dropped into a mounted directory appear without a remount.
EOF
# After an upgrade (configure with the old version), every mount of the installed binary
# (its keeper runs /usr/bin/pkgfs, replaced or not) gets a server of the new one: `pkgfs
# reload` through its keeper, readers see no error. Mounts of other pkgfs binaries are
# left alone; a mount that cannot be reloaded (no keeper, or its sources changed) keeps
# its old server.
cat > "$R/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -n "$2" ]; then
  awk '$3 == "fuse.pkgfs" { print $2 }' /proc/mounts | while read -r mp; do
    mp=$(printf '%b' "$mp")
    keeper=$(/usr/bin/pkgfs status --json "$mp" 2>/dev/null |
      sed -n 's/.*"keeper_pid":\([0-9][0-9]*\).*/\1/p')
    [ -n "$keeper" ] || continue
    case "$(readlink "/proc/$keeper/exe")" in
      /usr/bin/pkgfs | "/usr/bin/pkgfs (deleted)") ;;
      *) continue ;;
    esac
    /usr/bin/pkgfs reload "$mp" || echo "pkgfs: $mp keeps its old server" >&2
  done
fi
exit 0
EOF
chmod 0755 "$R/DEBIAN/postinst"
mkdir -p "$OUT"
DEB=$OUT/pkgfs_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group -Zxz --build "$R" "$DEB" >/dev/null
echo "$DEB"
