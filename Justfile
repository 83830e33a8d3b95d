# Everyday recipes. `just --list` shows them.

# Build the release binary.
build:
    cargo build --release

# fstab and systemd mount units with type fuse.pkgfs need the mount(8) helper.
# The Debian package (binary, mount helper, man pages, completions, examples) in
# target/debian: `apt install ./target/debian/pkgfs_*.deb`.
deb:
    bash packaging/deb.sh

# Install the binary in PREFIX/bin and link /sbin/mount.fuse.pkgfs to it.
install PREFIX="/usr/local": build
    install -D -m 0755 target/release/pkgfs {{PREFIX}}/bin/pkgfs
    ln -sf {{PREFIX}}/bin/pkgfs /sbin/mount.fuse.pkgfs

# The whole test suite: unit tests and real FUSE mounts (root and /dev/fuse needed),
# after installing the tools the tests call (mount-tests/run.sh).
test *ARGS:
    bash mount-tests/run.sh {{ARGS}}

# Only the mount tests.
mount-test:
    cargo test --test mount

# Formatting and lints, as CI runs them.
lint:
    cargo fmt --all -- --check
    cargo clippy --all-targets -- -D warnings

# Everything CI runs.
ci:
    bash .ci/run

# Regenerate the sample packages in images/.
images:
    python3 images/make-images.py

# Mount the sample packages at MNT (default /mnt) in the background.
demo MNT="/mnt": build
    ./target/release/pkgfs mount images {{MNT}}
    ls -l {{MNT}}

# Unmount the demo.
demo-stop MNT="/mnt":
    ./target/release/pkgfs umount {{MNT}}

# Installs linux-source-6.1 and the peers; needs ~10 GB in /var/tmp. Results, tables
# and plots go to docs/bench/ and docs/img/.
# All benchmarks on the Linux source: packing, the peer comparison, the scaling run,
# gzip tarballs; and container images.
bench: bench-pack bench-peers bench-targz bench-images bench-remote bench-layouts bench-registry bench-verify bench-crates bench-restart bench-walks bench-python bench-snapshotter

# Only the benchmark corpus (the tree, its zips, packages, squashfs image), to profile on.
bench-corpus WORKDIR="/var/tmp/pkgfs-bench":
    bash bench/corpus.sh {{WORKDIR}}

# Pack throughput and sizes against zip, tar|zstd and mksquashfs.
bench-pack:
    bash bench/pack.sh

# ARGS go to bench/peers.py (e.g. --only pkgfs-zst --skip-scaling).
# pkgfs against squashfuse_ll, kernel squashfs, fuse-zip, ratarmount, archivemount, the extracted tree.
bench-peers *ARGS:
    bash bench/peers.sh /var/tmp/pkgfs-bench {{ARGS}}

# gzip tarballs: the Linux tree as one tar.gz indexed against gzip -dc and ratarmount, its
# cached second mount, random reads in a 1 GiB member (needs bench-peers' corpus first).
bench-targz WORKDIR="/var/tmp/pkgfs-bench":
    bash bench/corpus.sh {{WORKDIR}}
    python3 bench/targz.py {{WORKDIR}} docs/bench/targz.json

# Container images: time from an image to a command's first output in it, against umoci
# unpack and tar -x, bytes of layers read, mount time (builds its Debian image once).
bench-images WORKDIR="/var/tmp/pkgfs-bench":
    cargo build --release
    python3 bench/images.py {{WORKDIR}} docs/bench/images.json

# Remote sources with 20 ms added each way (examples/delayproxy): the 609 packages, ZIP and
# pkgfs packages, over HTTP (nginx) and S3 (MinIO if `minio` is on PATH or in ~/go/bin, else
# moto), cold and on a warm disk cache, against the local mount, rclone mount, s3fs and a
# plain download (about 45 minutes; needs bench-peers' corpus; installs rclone and s3fs).
bench-remote WORKDIR="/var/tmp/pkgfs-bench":
    cargo build --release --bin pkgfs --example delayproxy
    command -v rclone >/dev/null && command -v s3fs >/dev/null || apt-get install -y rclone s3fs
    python3 bench/remote.py {{WORKDIR}} docs/bench/remote.json

# Layouts: 10,000 tarballs with --layout each (mount time and memory, one package entered)
# against merging them and extracting each; node_modules from a lockfile until express
# answers, against npm ci and pnpm install (offline, warm caches); a cargo build over a
# --layout cargo registry against cargo unpacking (about 20 minutes; installs pnpm).
bench-layouts WORKDIR="/var/tmp/pkgfs-bench":
    cargo build --release
    python3 bench/layouts.py {{WORKDIR}}/layouts docs/bench/layouts.json

# A Python environment from a hashed lock of ~70 wheels (pandas, jupyterlab, requests),
# until an import runs: pkgfs --layout python (index cache cold and warm) against pip
# (with and without compiling) and uv (cache cold and warm), offline (installs uv).
bench-python WORKDIR="/var/tmp/pkgfs-bench":
    cargo build --release
    python3 bench/python.py {{WORKDIR}} docs/bench/python.json

# Unit tests under AddressSanitizer (nightly), the C decoders (libdeflate, zstd) instrumented too.
asan:
    RUSTFLAGS=-Zsanitizer=address CFLAGS=-fsanitize=address cargo +nightly test --lib --target x86_64-unknown-linux-gnu --target-dir target/asan

# Fuzz one parser for a while: just fuzz zip_index|seekable_index|tar_headers|targz_index|any_archive
fuzz TARGET SECONDS="300":
    cd fuzz && mkdir -p corpus/{{TARGET}} && cargo +nightly fuzz run -O {{TARGET}} corpus/{{TARGET}} seeds/{{TARGET}} -- -max_total_time={{SECONDS}} -max_len=65536

# Images straight from a registry with 20 ms added each way (examples/delayproxy): time
# to python3's first output, pkgfs (gzip, zstd:chunked, SOCI; cold, warm) against skopeo
# copy + umoci unpack and podman pull, and a local layout (builds bench-images' image).
bench-registry WORKDIR="/var/tmp/pkgfs-bench":
    cargo build --release --bin pkgfs --example delayproxy
    python3 bench/registry.py {{WORKDIR}} docs/bench/registry.json

# containerd pulling through `pkgfs snapshotter` at 40 ms and 100 Mbit/s (delayproxy):
# time to python3's first output in `ctr run`, pkgfs (gzip, zstd:chunked, SOCI, eStargz;
# background fetch or lazy) against containerd's overlayfs, stargz-snapshotter and the
# SOCI snapshotter (built from the Go module proxy by bench/peers/build_snapshotters.sh).
bench-snapshotter WORKDIR="/var/tmp/pkgfs-bench":
    cargo build --release --bin pkgfs --example delayproxy
    python3 bench/snapshotter.py {{WORKDIR}} docs/bench/snapshotter.json

# Verified reads: pkgfs seal of the 609 packages against sha256sum, read-all with --verify
# against without, locally and over HTTP 40 ms away, for 16K, 64K and 256K blocks (needs
# bench-peers' corpus).
bench-verify WORKDIR="/var/tmp/pkgfs-bench":
    cargo build --release --bin pkgfs --example delayproxy
    python3 bench/verify.py {{WORKDIR}} docs/bench/verify.json

# A package cache of gzip tarballs read whole (this machine's cargo cache, one .crate a
# package): the extracted tree against pkgfs --layout each (first mount and indexes
# cached) and merged, with gzip's decode limit (a few minutes; release build first); again
# with the host's fuse.wake_here on where the kernel has it (put back after).
bench-crates WORKDIR="/var/tmp/pkgfs-bench":
    cargo build --release
    python3 bench/crates.py {{WORKDIR}} docs/bench/crates.json
    if [ -e /sys/module/fuse/parameters/wake_here ]; then python3 bench/crates.py {{WORKDIR}} docs/bench/crates-wake-here.json --setting wake-here; fi

# Cold walks of the Linux tree: find (names only) and find -size (a stat of every file) in
# fresh mounts, against the kernel's squashfs, squashfuse_ll and ext4 (needs bench-corpus),
# under each host setting this kernel has (as is, fuse.wake_here, guest halt polling; put
# back as found), with a cold read-all too.
bench-walks WORKDIR="/var/tmp/pkgfs-bench":
    cargo build --release
    python3 bench/walks.py {{WORKDIR}} docs/bench/walks-host.json --read-all --only ext4,kernel-squashfs,squashfuse_ll,pkgfs,pkgfs-no-keeper

# What a server's death costs readers (the keeper restarts it): the longest stall a reader
# of the mount sees and the keeper's pause, against a warm mount of the same sources, for
# this machine's crates (--layout each, locally and over HTTP), 10,000 packages and a
# million entries (a few minutes; release build first).
bench-restart WORKDIR="/var/tmp/pkgfs-bench":
    cargo build --release
    python3 bench/restart.py {{WORKDIR}} docs/bench/restart.json
