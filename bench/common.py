"""Helpers the benchmark scripts share: logging, shell commands, dropping the page
cache, emptying a cache directory fairly, unmounting a mountpoint for sure, and the host
settings a FUSE round trip depends on (docs/SEMANTICS.md, "Host settings")."""

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


# Host settings a FUSE round trip depends on, by name: the module parameters each sets.
HOST_SETTINGS = {
    "as-is": {},
    "wake-here": {"/sys/module/fuse/parameters/wake_here": "Y"},
    "halt-poll": {"/sys/module/haltpoll/parameters/guest_halt_poll_ns": "200000"},
}


def host_params():
    """The parameters HOST_SETTINGS touch that this kernel has, with their values now."""
    found = {}
    for path in sorted({p for s in HOST_SETTINGS.values() for p in s}):
        if os.path.exists(path):
            with open(path) as f:
                found[path] = f.read().strip()
    return found


def host_settings_here(found):
    """The settings this kernel can take, `as-is` first."""
    return [s for s in HOST_SETTINGS if all(p in found for p in HOST_SETTINGS[s])]


def apply_host_setting(setting, found):
    """The machine as `found`, then `setting`'s parameters on top."""
    if setting not in HOST_SETTINGS or setting not in host_settings_here(found):
        raise SystemExit(f"host setting {setting}: unknown, or this kernel lacks its parameter")
    for values in (found, HOST_SETTINGS[setting]):
        for path, value in values.items():
            with open(path, "w") as f:
                f.write(value)
