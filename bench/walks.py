#!/usr/bin/env python3
"""Cold walks of the Linux tree (issue 37's first table), every system in one run:

    walks.py WORKDIR OUT.json [--rounds N]

Needs bench/corpus.sh's corpus in WORKDIR (the extracted tree, linux.sqfs, the 609 ZIP
packages). Each step mounts the system afresh (page cache dropped first, so the image or
archives are read from disk too), then times, alternating systems round by round (N
rounds, default 3; medians and min-max):
  mount     until the mountpoint lists
  find      `find MP > /dev/null` (names and types only: no stat)
  find_size `find MP -size +0 > /dev/null` in a second fresh mount (a stat of every file)
Systems: the extracted tree on ext4 (no mount), the kernel's squashfs (loop, zstd image),
squashfuse_ll, pkgfs (its defaults: a keeper, /dev/fuse, plain directory entries, the
tree kept by a mount before the rounds in its own index cache, WORKDIR/walks-index),
pkgfs --no-kept-tree (every central directory read and folded at each mount),
pkgfs --full-entries (every listing entry with its attributes: before plain entries),
pkgfs --no-keeper (FUSE over io_uring if the kernel's fuse module has enable_uring
on: the report says which transport served), and pkgfs-packages (the same tree as 609
pkgfs packages, seekable zstd, bench/corpus.sh's pkgs-zst-all). `--only SYSTEM,...` runs only those.
`--read-all` adds a third fresh mount a step: `tar cf - .` of the whole tree, cold.

Host settings (docs/SEMANTICS.md, "Host settings"): every system is measured under each
setting `--settings` names (default: `as-is`, then each of the others this kernel has),
set before each of its steps and put back as found at the end:
  as-is      the machine as it is
  wake-here  fuse.wake_here=Y (a FUSE round trip's wake-ups stay on the waking CPU)
  halt-poll  haltpoll.guest_halt_poll_ns=200000 (an idle vCPU polls 200 us first)
Results go to OUT.json; a summary to standard output.
"""

import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import drop_caches, log, sh, unmount  # noqa: E402

WORK = sys.argv[1]
OUT = sys.argv[2]
ROUNDS = common.arg(sys.argv[3:], "--rounds", 3)
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKGFS = os.path.join(HERE, "target/release/pkgfs")
TREE = os.path.join(WORK, "linux")
SQFS = os.path.join(WORK, "linux.sqfs")
PKGS = os.path.join(WORK, "pkgs-zip-all")
ZST = os.path.join(WORK, "pkgs-zst-all")
MNT = os.path.join(WORK, "walks-mnt")
INDEX = os.path.join(WORK, "walks-index")

SYSTEMS = {
    "ext4": None,
    "kernel-squashfs": f"mount -t squashfs -o loop,ro '{SQFS}' '{MNT}'",
    "squashfuse_ll": f"squashfuse_ll '{SQFS}' '{MNT}'",
    "pkgfs": f"'{PKGFS}' mount --index-cache '{INDEX}' '{PKGS}' '{MNT}'",
    "pkgfs-folded": f"'{PKGFS}' mount --index-cache '{INDEX}' --no-kept-tree '{PKGS}' '{MNT}'",
    "pkgfs-full-entries": f"'{PKGFS}' mount --index-cache '{INDEX}' --full-entries '{PKGS}' '{MNT}'",
    "pkgfs-no-keeper": f"'{PKGFS}' mount --index-cache '{INDEX}' --no-keeper '{PKGS}' '{MNT}'",
    "pkgfs-packages": f"'{PKGFS}' mount --index-cache '{INDEX}' '{ZST}' '{MNT}'",
}


def root(system):
    return TREE if SYSTEMS[system] is None else MNT


def mount(system):
    """Mount `system` cold; seconds until its root lists (0 for the extracted tree)."""
    drop_caches()
    if SYSTEMS[system] is None:
        return 0.0
    t = time.monotonic()
    sh(SYSTEMS[system])
    os.listdir(MNT)
    return time.monotonic() - t


def transport(system):
    if not system.startswith("pkgfs"):
        return None
    out = subprocess.run([PKGFS, "status", "--json", MNT], capture_output=True, text=True)
    return json.loads(out.stdout).get("transport") if out.returncode == 0 else None


def timed(cmd):
    t = time.monotonic()
    sh(cmd)
    return time.monotonic() - t


def done(system):
    if SYSTEMS[system] is not None:
        unmount(MNT)


def main():
    for path in (TREE, SQFS, PKGS):
        if not os.path.exists(path):
            raise SystemExit(f"{path} is missing: run bench/corpus.sh {WORK} first")
    if not os.access(PKGFS, os.X_OK):
        raise SystemExit("build the release binary first (cargo build --release)")
    os.makedirs(MNT, exist_ok=True)
    args = sys.argv[3:]
    only = common.arg(args, "--only", None, str)
    systems = [s for s in SYSTEMS if not only or s in only.split(",")]
    found = common.host_params()
    named = common.arg(args, "--settings", None, str)
    settings = named.split(",") if named else common.host_settings_here(found)
    for s in settings:
        if s not in common.host_settings_here(found):
            raise SystemExit(f"host setting {s}: unknown, or this kernel lacks its parameter")
    steps = ["find", "find_size"] + (["read_all"] if "--read-all" in args else [])
    commands = {"find": "find '{}' > /dev/null", "find_size": "find '{}' -size +0 > /dev/null",
                "read_all": "tar cf - -C '{}' . | wc -c > /dev/null"}
    # The tree the pkgfs mounts load, kept by a first mount of this build.
    subprocess.run(["rm", "-rf", INDEX], check=True)
    for prep in ["pkgfs"] + (["pkgfs-packages"] if "pkgfs-packages" in systems else []):
        sh(SYSTEMS[prep])
        unmount(MNT)
    results = {h: {s: {k: [] for k in ["mount"] + steps} for s in systems} for h in settings}
    try:
        for r in range(ROUNDS):
            for h in settings:
                common.apply_host_setting(h, found)
                for s in systems:
                    res = results[h][s]
                    for i, step in enumerate(steps):
                        m = mount(s)
                        if i == 0:
                            res["mount"].append(m)
                            res["transport"] = transport(s)
                        res[step].append(timed(commands[step].format(root(s))))
                        done(s)
                    log(f"round {r + 1} [{h}] {s}: " + ", ".join(
                        f"{k} {res[k][-1]:.3f} s" for k in ["mount"] + steps))
    finally:
        common.apply_host_setting("as-is", found)
    summary = {}
    for h in settings:
        summary[h] = {s: {k: statistics.median(v) for k, v in res.items() if isinstance(v, list)}
                      for s, res in results[h].items()}
        ref = "kernel-squashfs" if "kernel-squashfs" in summary[h] else next(iter(summary[h]))
        ksq = summary[h][ref]
        print(f"[{h}]")
        for s, m in summary[h].items():
            print(f"  {s:20} mount {m['mount']:.3f} s  " + "  ".join(
                f"{k} {m[k]:.3f} s ({m[k] / ksq[k]:.2f}x {ref})" for k in steps)
                + (f"  [{results[h][s]['transport']}]" if results[h][s].get("transport") else ""))
    with open(OUT, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d %H:%M"), "rounds": ROUNDS, "found": found,
                   "results": results, "medians": summary}, f, indent=1)


if __name__ == "__main__":
    main()
