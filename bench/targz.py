#!/usr/bin/env python3
"""The single-tarball targets of issue "gzip tarballs in place", in one run:

    targz.py WORKDIR OUT.json [--rounds N]

On the Linux tree as one tar.gz (gzip -6, made by bench/corpus.sh), in N alternating
rounds (default 4), the archive in the page cache for each (so the decoders are
compared, not the disk):
  gunzip     `gzip -dc FILE > /dev/null`
  pkgfs      the first mount: `pkgfs mount` with an empty index cache, until it lists
             (the index pass, then the mount)
  ratarmount the first mount of ratarmount (its own index, made by rapidgzip) the same
             way
then the second mount of each (its index cached), cold (page cache dropped), median of
N; and in the 1 GiB member of WORKDIR/huge/targz/huge.tar.gz (bench/peers.py makes it),
after indexing, 200 random 4 KiB preads with the page cache dropped, for pkgfs and
ratarmount. Results go to OUT.json; a summary to standard output.
"""

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import drop_caches, log, sh  # noqa: E402

WORK = sys.argv[1]
OUT = sys.argv[2]
ARGS = sys.argv[3:]
ROUNDS = int(ARGS[ARGS.index("--rounds") + 1]) if "--rounds" in ARGS else 4
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKGFS = os.path.join(HERE, "target/release/pkgfs")
RAT = os.path.join(HERE, "target/bench-venv/bin/ratarmount")
MNT = os.path.join(WORK, "mnt")
TGZ = os.path.join(WORK, "linux.tar.gz")
HUGE = os.path.join(WORK, "huge/targz/huge.tar.gz")


def warm(path):
    sh(f"cat '{path}' > /dev/null")


def unmount():
    common.unmount(MNT)


def mount_time(cmd):
    """Seconds from running `cmd` until the mountpoint lists."""
    unmount()
    t0 = time.monotonic()
    sh(cmd)
    while True:
        try:
            if os.listdir(MNT):
                return time.monotonic() - t0
        except OSError:
            pass
        if time.monotonic() - t0 > 900:
            raise RuntimeError(cmd + ": never mounted")
        time.sleep(0.005)


def pkgfs_mount(archive, cache):
    return f"'{PKGFS}' mount --index-cache '{cache}' '{archive}' '{MNT}'"


def rat_mount(archive, index):
    return f"'{RAT}' --index-folders '{index}' '{archive}' '{MNT}'"


def random_preads(path, n=200):
    size = os.path.getsize(path)
    rnd = random.Random(42)
    fd = os.open(path, os.O_RDONLY)
    lat = []
    try:
        for _ in range(n):
            off = rnd.randrange(0, size - 4096) & ~4095
            t0 = time.monotonic()
            os.pread(fd, 4096, off)
            lat.append(time.monotonic() - t0)
    finally:
        os.close(fd)
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(round(p * (len(lat) - 1))))] * 1000
    return {"p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": lat[-1] * 1000}


def main():
    os.makedirs(MNT, exist_ok=True)
    tmp = os.path.join(WORK, "targz-bench")
    r = {"file": TGZ, "gz_bytes": os.path.getsize(TGZ), "rounds": ROUNDS,
         "measured": time.strftime("%Y-%m-%d %H:%M")}
    first = {"gunzip": [], "pkgfs": [], "ratarmount": []}
    for i in range(ROUNDS):
        log(f"== round {i + 1}")
        warm(TGZ)
        t0 = time.monotonic()
        sh(f"gzip -dc '{TGZ}' > /dev/null")
        first["gunzip"].append(time.monotonic() - t0)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        warm(TGZ)
        first["pkgfs"].append(mount_time(pkgfs_mount(TGZ, os.path.join(tmp, "pkgfs"))))
        unmount()
        warm(TGZ)
        first["ratarmount"].append(mount_time(rat_mount(TGZ, os.path.join(tmp, "rat"))))
        unmount()
        log({k: round(v[-1], 2) for k, v in first.items()})
    r["first"] = first
    r["first_median"] = {k: statistics.median(v) for k, v in first.items()}
    r["ratio_pkgfs_to_gunzip"] = [p / g for p, g in zip(first["pkgfs"], first["gunzip"])]
    r["ratio_ratarmount_to_pkgfs"] = [q / p for q, p in zip(first["ratarmount"], first["pkgfs"])]
    # Second mounts: indexes cached (the last round's), page cache dropped.
    second = {"pkgfs": [], "ratarmount": []}
    for _ in range(ROUNDS):
        drop_caches()
        second["pkgfs"].append(mount_time(pkgfs_mount(TGZ, os.path.join(tmp, "pkgfs"))))
        unmount()
        drop_caches()
        second["ratarmount"].append(mount_time(rat_mount(TGZ, os.path.join(tmp, "rat"))))
        unmount()
    r["second"] = second
    r["second_median"] = {k: statistics.median(v) for k, v in second.items()}
    # Random reads in the 1 GiB member, after indexing, cold.
    if os.path.exists(HUGE):
        huge = {}
        for name, cmd in [("pkgfs", pkgfs_mount(HUGE, os.path.join(tmp, "pkgfs-huge"))),
                          ("ratarmount", rat_mount(HUGE, os.path.join(tmp, "rat-huge")))]:
            mount_time(cmd)  # the index is made here
            unmount()
            drop_caches()
            mount_time(cmd)
            drop_caches()
            huge[name] = random_preads(os.path.join(MNT, "huge.txt"))
            unmount()
        r["huge_rand"] = huge
    shutil.rmtree(tmp, ignore_errors=True)
    with open(OUT, "w") as f:
        json.dump(r, f, indent=1)
    fm, sm = r["first_median"], r["second_median"]
    print(f"index pass (first mount), median of {ROUNDS}: pkgfs {fm['pkgfs']:.2f} s, "
          f"gzip -dc {fm['gunzip']:.2f} s, ratarmount {fm['ratarmount']:.2f} s; "
          f"pkgfs/gunzip rounds {', '.join(f'{x:.2f}' for x in r['ratio_pkgfs_to_gunzip'])}; "
          f"ratarmount/pkgfs rounds {', '.join(f'{x:.2f}' for x in r['ratio_ratarmount_to_pkgfs'])}")
    print(f"second mount (cached, cold), median: pkgfs {sm['pkgfs']:.3f} s "
          f"({', '.join(f'{x:.3f}' for x in second['pkgfs'])}), ratarmount {sm['ratarmount']:.3f} s")
    if "huge_rand" in r:
        for k, v in r["huge_rand"].items():
            print(f"1 GiB member, 200 random 4 KiB reads, cold: {k} p50 {v['p50_ms']:.2f} ms, "
                  f"p99 {v['p99_ms']:.2f} ms, max {v['max_ms']:.2f} ms")


if __name__ == "__main__":
    main()
