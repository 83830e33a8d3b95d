"""Helpers the benchmark scripts share: logging, shell commands, dropping the page
cache, and unmounting a mountpoint for sure."""

import os
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
