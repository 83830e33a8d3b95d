#!/usr/bin/env python3
"""A package cache of gzip tarballs read whole, the case this project started from
(issue 37's second table), in one run:

    crates.py WORKDIR OUT.json [--rounds N]

The store: every `.crate` file of this machine's cargo cache (`~/.cargo/registry/cache`,
real tarballs written by `cargo package`, one per crate, as pub.dev's cache holds one
per package), copied into WORKDIR/crates/store. Each step reads the whole tree with
`tar cf - . | wc -c` (a tool reading every file), page cache dropped first, N rounds
(default 3), median:
  extracted     the store extracted with `tar -xzf --strip-components 1`, one directory
                a crate, on the local disk
  each-first    `pkgfs mount --layout each --strip-components 1` with an empty index
                cache: each package indexed as the walk enters it, then read
  each-cached   the same with the index cache of the first run
  merged-cached `pkgfs mount` (one merged tree: each crate's own NAME-VERSION/ top
                directory keeps them apart), index cached
  each-cached-walk-again
                the same mount walked a second time, the kernel's caches dropped and
                the daemon's decoded blocks kept (`--cache-size 2G`): the walk through
                FUSE with next to no decoding, this walk's floor
and, page cache warm, the decode limits: `gzip -dc` of every archive on one thread and
on two (`xargs -P2`); pkgfs's own decoders on both cores (issue 37's limit: "every
member inflated by the project's own decoder on both cores"; examples/inflate_limit.rs,
each archive's stream inflated whole: `own-decoder` is zlib-rs streaming, what a gzip
tarball's reads decode with, `own-one-call` libdeflate); and `cat` of every archive
cold (the I/O). `--setting NAME` runs
it all under one host setting (common.HOST_SETTINGS: as-is, wake-here, halt-poll; docs/
SEMANTICS.md "Host settings"), put back as found at the end. Results go to OUT.json;
a summary to standard output.
"""

import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import drop_caches, log, sh  # noqa: E402

WORK = os.path.join(sys.argv[1], "crates")
OUT = sys.argv[2]
ROUNDS = common.arg(sys.argv[3:], "--rounds", 3)
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKGFS = os.path.join(HERE, "target/release/pkgfs")
STORE = os.path.join(WORK, "store")
TREE = os.path.join(WORK, "extracted")
MNT = os.path.join(WORK, "mnt")
CACHE = os.path.join(WORK, "index-cache")
INFLATE = os.path.join(HERE, "target/release/examples/inflate_limit")


def make_store():
    crates = sorted(glob.glob(os.path.expanduser("~/.cargo/registry/cache/*/*.crate")))
    if not crates:
        raise SystemExit("no .crate files in ~/.cargo/registry/cache (build once first)")
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(STORE)
    os.makedirs(TREE)
    os.makedirs(MNT)
    for c in crates:
        shutil.copy(c, STORE)
    for c in sorted(os.listdir(STORE)):
        d = os.path.join(TREE, c[: -len(".crate")])
        os.makedirs(d)
        sh(f"tar -xzf '{os.path.join(STORE, c)}' -C '{d}' --strip-components 1")
    files = int(subprocess.run(["bash", "-c", f"find '{TREE}' -type f | wc -l"],
                               capture_output=True, text=True, check=True).stdout)
    size = sum(os.path.getsize(os.path.join(STORE, c)) for c in os.listdir(STORE))
    extracted = int(subprocess.run(["du", "-sb", TREE], capture_output=True, text=True,
                                   check=True).stdout.split()[0])
    return {"crates": len(crates), "files": files, "store_bytes": size,
            "extracted_bytes": extracted}


def read_all(path):
    """Seconds to stream every file under path through tar, cold."""
    drop_caches()
    t0 = time.monotonic()
    sh(f"cd '{path}' && tar cf - . | wc -c")
    return time.monotonic() - t0


def mounted_read(args, fresh_cache):
    common.unmount(MNT)
    if fresh_cache:
        common.retire(CACHE)
    drop_caches()
    t0 = time.monotonic()
    sh(f"'{PKGFS}' mount --index-cache '{CACHE}' {args} '{STORE}' '{MNT}'")
    try:
        sh(f"cd '{MNT}' && tar cf - . | wc -c")
        return time.monotonic() - t0
    finally:
        common.unmount(MNT)


def walk_again(args):
    """Seconds for a second cold walk of one mount: the kernel's caches dropped, the
    daemon's decoded blocks kept (a budget that holds them all), so what is left is the
    walk through FUSE with next to no decoding."""
    common.unmount(MNT)
    sh(f"'{PKGFS}' mount --index-cache '{CACHE}' --cache-size 2G {args} '{STORE}' '{MNT}'")
    try:
        sh(f"cd '{MNT}' && tar cf - . | wc -c")
        drop_caches()
        t0 = time.monotonic()
        sh(f"cd '{MNT}' && tar cf - . | wc -c")
        return time.monotonic() - t0
    finally:
        common.unmount(MNT)


def own_decoder(threads, which):
    """Seconds for pkgfs's own deflate decoders to inflate every archive whole on
    `threads` threads, warm (examples/inflate_limit.rs): `streaming` (zlib-rs, what a
    gzip tarball's reads decode with) or `one_call` (libdeflate)."""
    out = subprocess.run(["bash", "-c", f"'{INFLATE}' --threads {threads} '{STORE}'/*.crate"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)[f"{which}_s"]


def decode(threads):
    sh(f"cat '{STORE}'/*.crate > /dev/null")
    t0 = time.monotonic()
    sh(f"ls '{STORE}'/*.crate | xargs -P{threads} -n 16 gzip -dc > /dev/null")
    return time.monotonic() - t0


def io_only():
    drop_caches()
    t0 = time.monotonic()
    sh(f"cat '{STORE}'/*.crate > /dev/null")
    return time.monotonic() - t0


def main():
    if not os.access(PKGFS, os.X_OK):
        raise SystemExit(f"{PKGFS} missing: cargo build --release")
    subprocess.run(["cargo", "build", "--release", "--quiet", "--example", "inflate_limit"],
                   cwd=HERE, check=True)
    facts = make_store()
    log(f"store: {facts}")
    each = "--layout each --strip-components 1"
    steps = {
        "extracted": lambda: read_all(TREE),
        "each-first": lambda: mounted_read(each, True),
        "each-cached": lambda: mounted_read(each, False),
        "merged-cached": lambda: mounted_read("", False),
        "each-cached-walk-again": lambda: walk_again(each),
        "gzip-1-thread-warm": lambda: decode(1),
        "gzip-2-threads-warm": lambda: decode(2),
        "own-decoder-2-threads-warm": lambda: own_decoder(2, "streaming"),
        "own-one-call-2-threads-warm": lambda: own_decoder(2, "one_call"),
        "cat-cold": io_only,
    }
    runs = {k: [] for k in steps}
    found = common.host_params()
    setting = common.arg(sys.argv[3:], "--setting", "as-is", str)
    common.apply_host_setting(setting, found)
    try:
        for r in range(ROUNDS):
            for name, step in steps.items():
                s = step()
                runs[name].append(round(s, 3))
                log(f"round {r + 1} {name}: {s:.3f} s")
    finally:
        common.apply_host_setting("as-is", found)
    med = {k: statistics.median(v) for k, v in runs.items()}
    base = med["extracted"]
    out = {"facts": facts, "setting": setting, "host": found, "runs": runs, "median": med,
           "ratio_to_extracted": {k: round(v / base, 3) for k, v in med.items()}}
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
    for k, v in med.items():
        print(f"{k:22} {v:7.3f} s  {v / base:5.2f}x the extracted tree")


if __name__ == "__main__":
    main()
