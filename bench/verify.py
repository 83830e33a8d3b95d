#!/usr/bin/env python3
"""The verified-reads targets (issue 31), in one run:

    verify.py WORKDIR OUT.json [--rounds N] [--delay-ms MS] [--blocks 16K,64K,256K]

The 609 Linux packages as ZIP archives (WORKDIR/pkgs-zip-all, bench/corpus.sh), sealed
by `pkgfs seal` with a new ed25519 key (a copy of the directory of hard links per block
size, so the archives are the same files), in N rotating rounds (default 3), the page
cache dropped before each step (for the HTTP steps, the served files put back in it:
the server is another machine's RAM):

  seal-BLOCK       `pkgfs seal` of the 609 archives (2 hashing threads)
  sha256sum        `sha256sum` of the same files (the target: seal under 1.5x this)
  local-plain      `pkgfs mount DIR` + `tar -C MNT -cf - . > /dev/zero` (read-all)
  local-BLOCK      the same with --verify, sealed with blocks of BLOCK
  http-plain       `pkgfs mount http://…/pkgs-zip-all/` through examples/delayproxy adding
                   MS ms (default 20) each way, an empty disk cache, then read-all; the
                   mount time recorded apart
  http-BLOCK       the same with --verify, sealed with blocks of BLOCK

All mounts with --no-index-cache, an empty --disk-cache and --io-uring off. Results to OUT.json, a summary to
standard output. Needs root, nginx and bench/corpus.sh's corpus.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

WORK = sys.argv[1]
OUT = sys.argv[2]
ARGS = sys.argv[3:]


def arg(name, default, kind=int):
    return common.arg(ARGS, name, default, kind)


ROUNDS = arg("--rounds", 3)
DELAY = arg("--delay-ms", 20)
BLOCKS = arg("--blocks", "16K,64K,256K", str).split(",")
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKGFS = os.path.join(HERE, "target/release/pkgfs")
DELAYPROXY = os.path.join(HERE, "target/release/examples/delayproxy")
PKGS = os.path.join(WORK, "pkgs-zip-all")
SCRATCH = os.path.join(WORK, "verify-bench")
MNT = os.path.join(SCRATCH, "mnt")
CHILDREN = []


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sh(cmd, **kw):
    return subprocess.run(["bash", "-c", cmd], check=True, stdout=subprocess.DEVNULL, **kw)


free_port = common.free_port
wait_listening = common.wait_listening


def spawn(cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    CHILDREN.append(p)
    return p


def files(d):
    return sorted(os.path.join(d, n) for n in os.listdir(d)
                  if os.path.isfile(os.path.join(d, n)) and not n.startswith("pkgfs.seal"))


def seal_files(d):
    """A sealed directory's seal, signature and trees."""
    trees = os.path.join(d, "pkgfs.seal.d")
    return ([os.path.join(d, "pkgfs.seal"), os.path.join(d, "pkgfs.seal.sig")]
            + [os.path.join(trees, n) for n in os.listdir(trees)])


def warm(paths):
    """The served files back in the page cache (the server's RAM)."""
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 22):
                pass


def timed(cmd):
    t0 = time.monotonic()
    sh(cmd)
    return time.monotonic() - t0


def mount_read_all(source, extra):
    """Seconds to mount, and to read every file after (a remote source with an empty
    disk cache: without one, ranges fetched ahead of the walk are dropped before use)."""
    state = os.path.join(SCRATCH, "state")
    cache = os.path.join(SCRATCH, "disk-cache")
    common.retire(cache)
    t0 = time.monotonic()
    sh(f"XDG_STATE_HOME='{state}' '{PKGFS}' mount -q --io-uring off --no-index-cache "
       f"--disk-cache '{cache}' {extra} '{source}' '{MNT}'")
    t1 = time.monotonic()
    sh(f"tar -C '{MNT}' -cf - . > /dev/zero")
    t2 = time.monotonic()
    common.unmount(MNT)
    return t1 - t0, t2 - t1


def main():
    if not os.path.isdir(PKGS):
        raise SystemExit(f"no {PKGS}: run bench/corpus.sh first")
    common.unmount(MNT)
    shutil.rmtree(SCRATCH, ignore_errors=True)
    os.makedirs(MNT)
    key = os.path.join(SCRATCH, "key")
    sh(f"ssh-keygen -q -t ed25519 -N '' -C bench@pkgfs -f '{key}'")
    with open(os.path.join(SCRATCH, "allowed"), "w") as f:
        f.write(f'bench@pkgfs namespaces="pkgfs" {open(key + ".pub").read()}')
    allowed = os.path.join(SCRATCH, "allowed")
    archives = files(PKGS)
    total = sum(os.path.getsize(p) for p in archives)
    sealed = {}
    for b in BLOCKS:
        d = os.path.join(WORK, f"pkgs-zip-sealed-{b}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for p in archives:
            os.link(p, os.path.join(d, os.path.basename(p)))
        sealed[b] = d
    nginx_dir = os.path.join(SCRATCH, "nginx")
    os.makedirs(os.path.join(nginx_dir, "logs"))
    os.makedirs(os.path.join(nginx_dir, "tmp"))
    nport = free_port()
    with open(os.path.join(nginx_dir, "nginx.conf"), "w") as f:
        f.write(f"daemon off; pid {nginx_dir}/nginx.pid; error_log {nginx_dir}/logs/error.log;\n"
                "worker_processes 2;\nevents {}\n"
                f"http {{ access_log off; client_body_temp_path {nginx_dir}/tmp;\n"
                f"  proxy_temp_path {nginx_dir}/tmp; fastcgi_temp_path {nginx_dir}/tmp;\n"
                f"  uwsgi_temp_path {nginx_dir}/tmp; scgi_temp_path {nginx_dir}/tmp;\n"
                f"  server {{ listen 127.0.0.1:{nport}; root {WORK}; autoindex on; }} }}\n")
    spawn(["nginx", "-c", os.path.join(nginx_dir, "nginx.conf"), "-p", nginx_dir])
    wait_listening(nport, "nginx")
    pport = free_port()
    spawn([DELAYPROXY, str(pport), str(nport), str(DELAY), os.path.join(SCRATCH, "proxy.stats")])
    wait_listening(pport, "delayproxy")
    url = lambda d: f"http://127.0.0.1:{pport}/{os.path.basename(d)}/"  # noqa: E731

    steps = {"sha256sum": None}
    for b in BLOCKS:
        steps[f"seal-{b}"] = b
    steps["local-plain"] = None
    for b in BLOCKS:
        steps[f"local-{b}"] = b
    steps["http-plain"] = None
    for b in BLOCKS:
        steps[f"http-{b}"] = b
    r = {"rounds": ROUNDS, "delay_ms": DELAY, "archives": len(archives), "bytes": total,
         "measured": time.strftime("%Y-%m-%d %H:%M"),
         "build": subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True).stdout.strip(),
         "seconds": {k: [] for k in steps}, "mount_s": {k: [] for k in steps}}
    # Seal once first: the mounts need the seals.
    for b in BLOCKS:
        sh(f"'{PKGFS}' seal -q '{sealed[b]}' --key '{key}' --block-size {b} --threads 2")
    for i in range(ROUNDS):
        for name, b in steps.items():
            common.drop_caches()
            if name == "sha256sum":
                t = timed(f"sha256sum {' '.join(repr(p) for p in archives)} > /dev/null")
                m = 0.0
            elif name.startswith("seal-"):
                t = timed(f"'{PKGFS}' seal -q '{sealed[b]}' --key '{key}' --block-size {b} --threads 2")
                m = 0.0
            elif name == "local-plain":
                m, t = mount_read_all(PKGS, "")
            elif name.startswith("local-"):
                m, t = mount_read_all(sealed[b], f"--verify '{allowed}'")
            elif name == "http-plain":
                warm(archives)
                m, t = mount_read_all(url(PKGS), "")
            else:
                warm(archives + seal_files(sealed[b]))
                m, t = mount_read_all(url(sealed[b]), f"--verify '{allowed}'")
            r["seconds"][name].append(t)
            r["mount_s"][name].append(m)
        log(f"round {i + 1}:", {k: round(v[-1] + r['mount_s'][k][-1], 3) for k, v in r["seconds"].items()})
    med = lambda xs: statistics.median(xs)  # noqa: E731
    r["median_s"] = {k: med(v) for k, v in r["seconds"].items()}
    r["median_mount_s"] = {k: med(v) for k, v in r["mount_s"].items()}
    with open(OUT, "w") as f:
        json.dump(r, f, indent=1)
    m, mm = r["median_s"], r["median_mount_s"]
    print(f"{len(archives)} archives, {total / 1e6:.1f} MB; {DELAY} ms each way over HTTP")
    for k in steps:
        rounds = ", ".join(f"{a + b:.3f}" for a, b in zip(r["mount_s"][k], r["seconds"][k]))
        print(f"  {k:14} {mm[k] + m[k]:.3f} s (mount {mm[k]:.3f} s; rounds {rounds})")
    for b in BLOCKS:
        print(f"  seal {b} / sha256sum: {m[f'seal-{b}'] / m['sha256sum']:.2f}x; "
              f"local read-all verified {b} / plain: "
              f"{(m[f'local-{b}'] + mm[f'local-{b}']) / (m['local-plain'] + mm['local-plain']):.2f}x")
    for b in BLOCKS:
        print(f"  http read-all verified {b} / plain: "
              f"{(m[f'http-{b}'] + mm[f'http-{b}']) / (m['http-plain'] + mm['http-plain']):.2f}x; "
              f"mount {mm[f'http-{b}'] / mm['http-plain']:.2f}x")


if __name__ == "__main__":
    try:
        main()
    finally:
        common.unmount(MNT)
        for p in CHILDREN:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
