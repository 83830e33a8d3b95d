#!/usr/bin/env python3
"""Alternating cold read-alls, to compare pkgfs builds on this noisy 2-core machine.

    bench/alternate.py [--rounds N] [--source DIR] [--work DIR] [--states] PKGFS...

Each round reads the whole tree cold (`tar cf - . > /dev/zero`, page cache dropped) through
each PKGFS binary in turn (a fresh mount of --source, default the benchmark's ZIP
packages), then from the extracted tree, so a slow minute of the machine weighs on all of
them alike. Per read it prints the wall time, the busy, idle and iowait time of all cores
(/proc/stat), the disk's read requests, and the daemon's CPU time, in all and per thread
(warmer, pusher, FUSE workers). With --states it also samples the states of `tar`'s and
the daemon's threads every 5 ms (what each waits on, and how many are runnable at once):
the sampling costs some CPU itself, so it belongs in a separate run from timings.

The corpus comes from bench/corpus.sh (`just bench-corpus`). docs/BENCHMARKS.md quotes
runs of this script ("The cold read-all, thread by thread").
"""

import argparse
import collections
import glob
import os
import subprocess
import time


def cpu_times():
    """(busy, idle, iowait) jiffies of all cores."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq = v[:7]
    return user + nice + system + irq + softirq, idle, iowait


def disk_reads(path):
    """Read requests completed so far by the block device holding `path`."""
    st = os.stat(path)
    dev = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat"
    try:
        with open(dev) as f:
            return int(f.read().split()[0])
    except OSError:
        return 0


def cold():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def thread_cpu(pid):
    """{thread name: CPU seconds} of a process, and its total."""
    hz = os.sysconf("SC_CLK_TCK")
    out = {}
    for t in glob.glob(f"/proc/{pid}/task/*"):
        try:
            with open(t + "/stat") as f:
                s = f.read()
        except OSError:
            continue
        name = s[s.index("(") + 1 : s.rindex(")")]
        fields = s[s.rindex(")") + 2 :].split()
        out[name] = out.get(name, 0) + (int(fields[11]) + int(fields[12])) / hz
    return out


def walk_thread(name):
    """A thread of the walk: the reader, the warmer, the pusher or a FUSE worker (of
    fuser's `/dev/fuse` loop or an io_uring queue)."""
    return name in ("tar", "pkgfs-warm", "pkgfs-prefetch") or name.startswith("pkgfs-ring") or (
        name.startswith("fuser-") and name[len("fuser-"):].isdigit())


def sample_states(pids, proc, into, runnable):
    """Sample thread states of `pids` every 5 ms until `proc` ends."""
    while proc.poll() is None:
        n = 0
        for pid in pids:
            for t in glob.glob(f"/proc/{pid}/task/*"):
                try:
                    with open(t + "/stat") as f:
                        s = f.read()
                    with open(t + "/wchan") as f:
                        wchan = f.read()
                except OSError:
                    continue
                name = s[s.index("(") + 1 : s.rindex(")")]
                state = s[s.rindex(")") + 2]
                n += state == "R"
                into[(name, state, "" if state == "R" else wchan)] += 1
        runnable[n] += 1
        time.sleep(0.005)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pkgfs", nargs="+", help="pkgfs binaries to compare")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default="/var/tmp/pkgfs-bench")
    ap.add_argument("--source", help="what to mount (default WORK/pkgs-zip-all)")
    ap.add_argument("--states", action="store_true", help="sample thread states")
    a = ap.parse_args()
    source = a.source or os.path.join(a.work, "pkgs-zip-all")
    tree = os.path.join(a.work, "linux")
    mnt = os.path.join(a.work, "mnt-alternate")
    os.makedirs(mnt, exist_ok=True)
    for r in range(1, a.rounds + 1):
        for binary in a.pkgfs + [None]:
            cold()
            if binary:
                subprocess.run([binary, "mount", source, mnt], check=True)
                pid = int(subprocess.check_output(["pgrep", "-n", "-f", f"mount {source} {mnt}"]))
                root = mnt
            else:
                root = tree
            b0, i0, w0 = cpu_times()
            d0, t0 = disk_reads(a.work), time.monotonic()
            proc = subprocess.Popen(f"cd '{root}' && exec tar cf - . > /dev/zero", shell=True)
            states, runnable = collections.Counter(), collections.Counter()
            if a.states:
                sample_states([proc.pid] + ([pid] if binary else []), proc, states, runnable)
            proc.wait()
            wall, (b1, i1, w1), d1 = time.monotonic() - t0, cpu_times(), disk_reads(a.work)
            hz = os.sysconf("SC_CLK_TCK")
            line = (f"{r} {binary or 'extracted tree':<30} wall {wall:.2f} s  busy {(b1 - b0) / hz:.2f}"
                    f"  idle {(i1 - i0) / hz:.2f}  iowait {(w1 - w0) / hz:.2f}  disk reads {d1 - d0}")
            if binary:
                cpu = thread_cpu(pid)
                keep = {k: v for k, v in cpu.items() if walk_thread(k)}
                line += f"  daemon CPU {sum(cpu.values()):.2f} s (" + " ".join(
                    f"{k}={v:.2f}" for k, v in sorted(keep.items())) + ")"
                subprocess.run([binary, "umount", mnt], check=True)
            print(line, flush=True)
            if a.states:
                total = sum(runnable.values()) or 1
                print("   runnable threads at once:", ", ".join(
                    f"{k}: {v / total:.0%}" for k, v in sorted(runnable.items())))
                shown = [(k, c) for k, c in states.most_common() if walk_thread(k[0])]
                for (name, state, wchan), c in shown[:14]:
                    print(f"   {c / total:6.1%}  {name} {state} {wchan}")


if __name__ == "__main__":
    main()
