#!/usr/bin/env python3
"""What a server's death costs readers (issue 35), against a warm mount of the same
sources, in one run:

    restart.py WORKDIR OUT.json [--rounds N]

For each set of sources (built once under WORKDIR/restart):
  crates-each   this machine's cargo cache (`.crate` gzip tarballs, written by `cargo
                package`), `--layout each --strip-components 1`
  10k-each      10,000 small ZIP archives (two members each), `--layout each`
  million       one ZIP of 1,000,000 empty members in 1,000 directories (merged)
  609-zip       the 609 Linux packages as ZIP archives, if bench/corpus.sh made them
  http-crates   the crates over HTTP (nginx on loopback, autoindex), `--layout each
                --strip-components 1`, on a warm disk cache: a restart lists the store
                again and reads what it indexes from the disk cache
two measures, N rounds (default 3), median:
  warm mount    `pkgfs mount` until it returns, index cache and page cache warm
  pause         a reader stats new names in the mount in a loop (each a LOOKUP the
                server must answer); the server is killed with SIGKILL; the longest
                single stat is the stall a reader saw, and the keeper's own measure
                (death to serving again) is `last_pause_ms`. Failed stats are counted
                (the goal: none).
Results go to OUT.json; a summary to standard output.
"""

import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import log, unmount  # noqa: E402

WORK = os.path.join(sys.argv[1], "restart")
OUT = sys.argv[2]
ROUNDS = common.arg(sys.argv[3:], "--rounds", 3)
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKGFS = os.path.join(HERE, "target/release/pkgfs")
MNT = os.path.join(WORK, "mnt")
CACHE = os.path.join(WORK, "index-cache")


def crates():
    d = os.path.join(WORK, "crates")
    if not os.path.isdir(d):
        found = sorted(glob.glob(os.path.expanduser("~/.cargo/registry/cache/*/*.crate")))
        if not found:
            return None
        os.makedirs(d)
        for c in found:
            shutil.copy(c, d)
    return d


def ten_thousand():
    d = os.path.join(WORK, "10k")
    if not os.path.isdir(d):
        os.makedirs(d + ".tmp", exist_ok=True)
        for i in range(10_000):
            with zipfile.ZipFile(f"{d}.tmp/pkg{i:05}-1.0.zip", "w") as z:
                z.writestr("README", f"package {i}\n")
                z.writestr(f"lib/mod{i}.py", "x = 1\n" * 20)
        os.rename(d + ".tmp", d)
    return d


def million():
    p = os.path.join(WORK, "million.zip")
    if not os.path.exists(p):
        with zipfile.ZipFile(p + ".tmp", "w") as z:
            for d in range(1000):
                for f in range(1000):
                    z.writestr(f"d{d:03}/f{f:03}", b"")
        os.rename(p + ".tmp", p)
    return p


class Nginx:
    """nginx serving WORK with autoindex on a free loopback port (as the mount tests)."""

    def __init__(self):
        d = os.path.join(WORK, "nginx")
        os.makedirs(os.path.join(d, "logs"), exist_ok=True)
        os.makedirs(os.path.join(d, "tmp"), exist_ok=True)
        self.port = common.free_port()
        with open(os.path.join(d, "nginx.conf"), "w") as f:
            f.write(f"daemon off; pid {d}/nginx.pid; error_log {d}/logs/error.log;\n"
                    "events {}\n"
                    f"http {{ access_log off; client_body_temp_path {d}/tmp;\n"
                    f"  proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;\n"
                    f"  uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;\n"
                    f"  server {{ listen 127.0.0.1:{self.port}; root {WORK}; autoindex on; }} }}\n")
        self.proc = subprocess.Popen(["nginx", "-c", os.path.join(d, "nginx.conf"), "-p", d],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        common.wait_listening(self.port, "nginx")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


def mount(src, args):
    t = time.monotonic()
    subprocess.run([PKGFS, "mount", src, MNT, "--index-cache", CACHE, *args], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - t


def status():
    out = subprocess.run([PKGFS, "status", "--json", MNT], capture_output=True)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)


def pause(src, args):
    mount(src, args)
    try:
        os.listdir(MNT)
        st = status()
        old = st["server_pid"]
        times, errors, stop = [], [], threading.Event()

        def reader():
            i = 0
            while not stop.is_set():
                i += 1
                t = time.monotonic()
                try:
                    os.stat(os.path.join(MNT, f".probe-{os.getpid()}-{i}"))
                except FileNotFoundError:
                    pass
                except OSError as e:
                    errors.append(e.errno)
                times.append(time.monotonic() - t)

        th = threading.Thread(target=reader)
        th.start()
        time.sleep(0.3)
        os.kill(old, signal.SIGKILL)
        while True:
            st = status()
            # The new server answers, and has heard from the keeper what its start cost.
            if st and st["server_pid"] != old and st["keeper"]["last_pause_ms"] is not None:
                break
            time.sleep(0.01)
        time.sleep(0.3)
        stop.set()
        th.join()
        return max(times), st["keeper"]["last_pause_ms"] / 1000, len(errors)
    finally:
        unmount(MNT)


def main():
    os.makedirs(MNT, exist_ok=True)
    sets = []
    c = crates()
    if c:
        sets.append(("crates-each", c, ["--layout", "each", "--strip-components", "1"]))
    sets.append(("10k-each", ten_thousand(), ["--layout", "each"]))
    sets.append(("million", million(), []))
    zips = os.path.join(sys.argv[1], "pkgs-zip-all")
    if os.path.isdir(zips):
        sets.append(("609-zip", zips, []))
    nginx = None
    if c and shutil.which("nginx"):
        subprocess.run(["chmod", "-R", "a+rX", WORK], check=True)
        nginx = Nginx()
        sets.append(("http-crates", f"http://127.0.0.1:{nginx.port}/crates/",
                     ["--layout", "each", "--strip-components", "1",
                      "--disk-cache", os.path.join(WORK, "disk-cache")]))
    try:
        results = run_sets(sets)
    finally:
        if nginx:
            nginx.stop()
    with open(OUT, "w") as f:
        json.dump({"rounds": ROUNDS, "results": results}, f, indent=1)


def run_sets(sets):
    results = {}
    for name, src, args in sets:
        log(f"{name}: warming")
        mount(src, args)
        unmount(MNT)
        warm = []
        for _ in range(ROUNDS):
            warm.append(mount(src, args))
            unmount(MNT)
        stalls, pauses, errors = [], [], 0
        for _ in range(ROUNDS):
            s, p, e = pause(src, args)
            stalls.append(s)
            pauses.append(p)
            errors += e
        r = {
            "warm_mount_s": statistics.median(warm),
            "stall_s": statistics.median(stalls),
            "stall_max_s": max(stalls),
            "keeper_pause_s": statistics.median(pauses),
            "failed_reads": errors,
        }
        r["stall_over_warm_mount"] = r["stall_s"] / r["warm_mount_s"]
        results[name] = r
        print(f"{name:12} warm mount {r['warm_mount_s']:.3f} s, stall {r['stall_s']:.3f} s "
              f"(max {r['stall_max_s']:.3f}), keeper's pause {r['keeper_pause_s']:.3f} s, "
              f"{r['stall_over_warm_mount']:.2f}x, failed reads {errors}", flush=True)
    return results


if __name__ == "__main__":
    main()
