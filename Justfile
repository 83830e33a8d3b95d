# Everyday recipes. `just --list` shows them.

# Build the release binary.
build:
    cargo build --release

# The whole test suite: unit tests and real FUSE mounts (root and /dev/fuse needed).
test:
    cargo test

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

# Pack benchmark on the Linux source (installs linux-source-6.1; ~6 GB in /var/tmp).
bench:
    bash bench/pack.sh
