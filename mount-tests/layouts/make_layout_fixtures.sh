#!/usr/bin/env bash
# Fixtures of the layout mount tests (mount-tests/layouts.rs), made by the real tools:
#
#   make_layout_fixtures.sh DIR
#
# builds, once, into DIR (the tests pass $CARGO_TARGET_TMPDIR/layout-fixtures):
#
#   npm/project/        package.json + package-lock.json (pinned, from
#                       mount-tests/layouts/npm/; no node_modules)
#   npm/tarballs/       every package of the lockfile, as `npm pack NAME@VERSION` writes
#                       it (scoped: SCOPE-NAME-VERSION.tgz), checked against the
#                       lockfile's integrity
#   npm/ci/             a copy of the project where `npm ci --offline --ignore-scripts`
#                       (from a cache holding only those tarballs) wrote node_modules: the
#                       reference of the npm layout with --lockfile
#   npm/flat/           the tarballs of the packages the lockfile puts at the top (one
#                       version of each name) and @pkgfs-test/hello (npm pack of a package
#                       whose bin is 0644 in its tarball): the npm layout without lockfile
#   npm/top.txt         the project's direct dependencies, one a line
#   cargo/crate/        a crate depending on serde_json, regex and itoa (pinned
#                       Cargo.lock, from mount-tests/layouts/crate/)
#   cargo/home/         its CARGO_HOME after `cargo fetch`: registry/cache/INDEX/*.crate,
#                       registry/index/INDEX/, and registry/src/INDEX/ EMPTY
#   cargo/unpacked/     what cargo fetch unpacked into registry/src/INDEX/: the reference
#   cargo/index.txt     INDEX (index.crates.io-…)
#   each/src/           archives as build tools' stores hold them: gzip tarballs without
#                       a top directory (as pub.dev ships them: `tar -C DIR -czf F .`), a
#                       tar.zst without one, an npm .tgz, a .crate, a .zip and a plain
#                       .tar with one
#   each/expected/      each archive of each/src extracted (GNU tar as root, unzip) into
#                       NAME/, NAME its file name less the archive extension
#   each/top/           the archives of each/src that have a top directory
#   each/expected-strip1/  those extracted with `tar --strip-components 1` (the zip: its
#                       top directory's contents)
#
# Inputs come from the npm registry and crates.io (pinned versions); nothing else is
# downloaded. DIR/stamp holds a digest of this script and its pinned inputs: the
# fixtures are rebuilt only when that changes. Built in DIR.part, then renamed, so an
# interrupted build is never taken for the fixtures.
set -euo pipefail

dir=${1:?usage: make_layout_fixtures.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)
export TZ=UTC LC_ALL=C
# npm applies the umask to what it writes (the reference); GNU tar and unzip too.
umask 022

stamp=$(cat "$0" "$here/npm/package.json" "$here/npm/package-lock.json" \
    "$here/crate/Cargo.toml" "$here/crate/Cargo.lock" "$here/crate/src/main.rs" |
    sha256sum | cut -d' ' -f1)
if [ "$(cat "$dir/stamp" 2>/dev/null)" = "$stamp" ]; then
    exit 0
fi

part="$dir.part"
rm -rf "$part"
mkdir -p "$part"
work="$part/work"
mkdir -p "$work"

# ---------------------------------------------------------------- npm
# npm reads no user or project configuration of this machine: an empty npmrc, a cache
# of our own (deleted at the end: the tests never use it).
npmrc="$work/npmrc"
: > "$npmrc"
npm_() {
    npm --userconfig "$npmrc" --cache "$work/npm-cache" --no-update-notifier \
        --no-audit --no-fund --loglevel warn "$@"
}
mkdir -p "$part/npm/project" "$part/npm/tarballs"
cp "$here/npm/package.json" "$here/npm/package-lock.json" "$part/npm/project/"
python3 - "$part/npm/project/package.json" > "$part/npm/top.txt" <<'EOF'
import json, sys
print("\n".join(sorted(json.load(open(sys.argv[1]))["dependencies"])))
EOF
# NAME@VERSION of every package the lockfile installs (its path's last component).
python3 - "$part/npm/project/package-lock.json" > "$work/specs" <<'EOF'
import json, sys
lock = json.load(open(sys.argv[1]))
specs = set()
for path, p in lock["packages"].items():
    if not path:
        continue
    name = p.get("name") or path.rsplit("node_modules/", 1)[1]
    specs.add(f"{name}@{p['version']}")
print("\n".join(sorted(specs)))
EOF
(cd "$part/npm/tarballs" && xargs -a "$work/specs" npm --userconfig "$npmrc" \
    --cache "$work/npm-cache" --no-update-notifier --loglevel warn pack --silent \
    > /dev/null)
# Every tarball is the registry's, byte for byte: its sha512 is the lockfile's integrity.
python3 - "$part/npm/project/package-lock.json" "$part/npm/tarballs" <<'EOF'
import base64, hashlib, json, os, sys
lock = json.load(open(sys.argv[1]))
have = {}
for f in os.listdir(sys.argv[2]):
    d = hashlib.sha512(open(os.path.join(sys.argv[2], f), "rb").read()).digest()
    have["sha512-" + base64.b64encode(d).decode()] = f
want = {p["integrity"] for k, p in lock["packages"].items() if k}
missing = want - set(have)
assert not missing, f"no tarball for {missing}"
assert len(have) == len(want), f"tarballs not in the lockfile: {set(have) - want}"
EOF
# The reference: npm ci, offline, from a cache holding exactly those tarballs.
rm -rf "$work/npm-cache"
npm_ cache add "$part"/npm/tarballs/*.tgz > /dev/null
mkdir -p "$part/npm/ci"
cp "$here/npm/package.json" "$here/npm/package-lock.json" "$part/npm/ci/"
(cd "$part/npm/ci" && npm_ ci --offline --ignore-scripts > /dev/null)
test -f "$part/npm/ci/node_modules/.package-lock.json"
test -L "$part/npm/ci/node_modules/.bin/semver"
test -d "$part/npm/ci/node_modules/send/node_modules"
# Without a lockfile: the tarballs of the packages the lockfile hoists to the top (one
# version of each name), and a scoped package of our own, packed by npm pack, whose bin
# is not executable in its tarball (npm pack keeps 0644; npm install makes it 0755).
mkdir -p "$part/npm/flat" "$work/hello/bin"
cat > "$work/hello/package.json" <<'JSON'
{"name": "@pkgfs-test/hello", "version": "1.0.0", "main": "index.js",
 "bin": {"pkgfs-hello": "bin/hello.js"}}
JSON
printf '#!/usr/bin/env node\nconsole.log("hello from " + require("..") + " " + require("semver").valid("1.2.3"))\n' \
    > "$work/hello/bin/hello.js"
echo 'module.exports = "pkgfs";' > "$work/hello/index.js"
chmod 644 "$work/hello/bin/hello.js"
(cd "$part/npm/flat" && npm_ pack --silent "$work/hello" > /dev/null)
test -f "$part/npm/flat/pkgfs-test-hello-1.0.0.tgz"
python3 - "$part/npm/project/package-lock.json" > "$work/flat" <<'EOF2'
import json, sys
for path, p in json.load(open(sys.argv[1]))["packages"].items():
    if path.count("node_modules/") == 1:
        name = path.split("/", 1)[1]
        print(name.replace("@", "").replace("/", "-") + "-" + p["version"] + ".tgz")
EOF2
(cd "$part/npm/tarballs" && xargs -a "$work/flat" cp -t "$part/npm/flat")

# ---------------------------------------------------------------- cargo
mkdir -p "$part/cargo/crate/src" "$part/cargo/home"
cp "$here/crate/Cargo.toml" "$here/crate/Cargo.lock" "$part/cargo/crate/"
cp "$here/crate/src/main.rs" "$part/cargo/crate/src/"
(cd "$part/cargo/crate" && env -u CARGO_TARGET_DIR CARGO_HOME="$part/cargo/home" \
    cargo fetch --locked --quiet)
index=$(cd "$part/cargo/home/registry/cache" && ls)
test "$(echo "$index" | wc -l)" = 1
echo "$index" > "$part/cargo/index.txt"
# cargo fetch unpacks too: kept as the reference, and the tests mount the cache there
# instead.
mv "$part/cargo/home/registry/src/$index" "$part/cargo/unpacked"
mkdir -p "$part/cargo/home/registry/src/$index"
rm -rf "$part/cargo/home/.package-cache" "$part/cargo/home/.package-cache-mutate" \
    "$part/cargo/home/.global-cache"
cache="$part/cargo/home/registry/cache/$index"

# ---------------------------------------------------------------- each
src="$part/each/src"
top="$part/each/top"
mkdir -p "$src" "$top"
unpack_npm() { # TARBALL DIR: the package's files (under package/)
    mkdir -p "$2"
    tar -C "$2" -xzf "$1" --no-same-owner
    chmod 755 "$2/package"
}
unpack_crate() { # CRATE DIR
    mkdir -p "$2"
    tar -C "$2" -xzf "$1" --no-same-owner
}
unpack_npm "$part/npm/tarballs/semver-7.6.3.tgz" "$work/semver"
unpack_npm "$part/npm/tarballs/qs-6.13.0.tgz" "$work/qs"
unpack_crate "$cache/memchr-2.8.3.crate" "$work/memchr"
unpack_crate "$cache/ryu-1.0.23.crate" "$work/ryu"
# Without a top directory, as pub.dev ships packages: gzip and zstd.
tar -C "$work/semver/package" -czf "$src/semver-7.6.3.tar.gz" .
tar -C "$work/qs/package" --zstd -cf "$src/qs-6.13.0.tar.zst" .
# With one: an npm tarball and a crate as their registries serve them, a zip and a tar.
cp "$part/npm/tarballs/express-4.21.2.tgz" "$src/"
cp "$cache/itoa-1.0.14.crate" "$src/"
(cd "$work/memchr" && zip -qr "$src/memchr-2.8.3.zip" memchr-2.8.3)
tar -C "$work/ryu" -cf "$src/ryu-1.0.23.tar" ryu-1.0.23
for f in express-4.21.2.tgz itoa-1.0.14.crate memchr-2.8.3.zip ryu-1.0.23.tar; do
    cp "$src/$f" "$top/"
done

# The references: GNU tar (as root: owners and modes as stored) and unzip, each into
# NAME/; NAME/ itself as pkgfs shows a package directory (0755, the archive's mtime).
extract() { # ARCHIVE DIR [tar options]
    local a=$1 d=$2
    shift 2
    mkdir -p "$d"
    case "$a" in
    *.zip) unzip -q "$a" -d "$d" ;;
    *) tar -C "$d" -xpf "$a" --same-owner --numeric-owner "$@" ;;
    esac
    chmod 755 "$d"
    touch -r "$a" "$d"
}
for a in "$src"/*; do
    n=$(basename "$a")
    n=${n%.tar.gz} n=${n%.tar.zst} n=${n%.tgz} n=${n%.crate} n=${n%.zip} n=${n%.tar}
    extract "$a" "$part/each/expected/$n"
done
for a in "$top"/*; do
    n=$(basename "$a")
    n=${n%.tgz} n=${n%.crate} n=${n%.zip} n=${n%.tar}
    d="$part/each/expected-strip1/$n"
    case "$a" in
    *.zip)
        mkdir -p "$work/strip/$n"
        unzip -q "$a" -d "$work/strip/$n"
        mv "$work/strip/$n"/* "$d"
        chmod 755 "$d"
        touch -r "$a" "$d"
        ;;
    *) extract "$a" "$d" --strip-components 1 ;;
    esac
done

rm -rf "$work"
echo "$stamp" > "$part/stamp"
rm -rf "$dir"
mv "$part" "$dir"
