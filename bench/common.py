"""Helpers the benchmark scripts share: logging, shell commands, dropping the page
cache, emptying a cache directory fairly, and unmounting a mountpoint for sure."""

import atexit
import os
import shutil
import socket
import subprocess
import sys
import time


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sh(cmd, check=True):
    """Run cmd in bash, stdout discarded, stderr kept in the result."""
    return subprocess.run(["bash", "-c", cmd], check=check,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


_RETIRED = []


def retire(path):
    """Empty a cache directory for the next cold run by moving it aside, not deleting it.

    For about 30 s after thousands of files are deleted, ext4 creates files slowly (its
    inode allocator scans past the recently deleted ones, `recently_deleted()` in a
    profile): a run that starts right after a deletion pays that, its peer in the next
    step does not (measured: a remote mount 1.5 s against 0.7 s). The directories moved
    aside are deleted when the benchmark exits."""
    if not os.path.lexists(path):
        return
    if not _RETIRED:
        atexit.register(purge_retired)
    dest = f"{path}.retired-{os.getpid()}-{len(_RETIRED)}"
    os.rename(path, dest)
    _RETIRED.append(dest)


def purge_retired():
    while _RETIRED:
        shutil.rmtree(_RETIRED.pop(), ignore_errors=True)


def mounted(mnt):
    with open("/proc/self/mounts") as f:
        return any(l.split(" ")[1] == mnt for l in f)


def unmount(mnt):
    """umount, then a lazy umount, until mnt is no longer a mountpoint (10 s at most)."""
    for _ in range(100):
        if not mounted(mnt):
            return
        subprocess.run(["umount", mnt], stderr=subprocess.DEVNULL)
        if mounted(mnt):
            subprocess.run(["umount", "-l", mnt], stderr=subprocess.DEVNULL)
        time.sleep(0.1)
    raise RuntimeError("cannot unmount " + mnt)


def arg(args, name, default, kind=int):
    """The value after `name` in args, converted, or default."""
    return kind(args[args.index(name) + 1]) if name in args else default


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, what):
    """Until something accepts on port (30 s at most)."""
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{what} does not listen on {port}")
