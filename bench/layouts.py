#!/usr/bin/env python3
"""Layouts benchmark (`just bench-layouts`): one run, pkgfs and its peers side by side.

1. 10,000 gzip tarballs mounted with `--layout each`: time until `pkgfs mount` returns
   and the daemon's memory, cold and warm; entering one package; against `pkgfs mount`
   merging (and so indexing) all of them, and against extracting each into its own
   directory with `tar -xzf`, the step a layout saves.
2. npm: from nothing to the first HTTP answer of an express app: `pkgfs mount --layout
   npm --lockfile` against `npm ci --offline` (npm's cache warm) and `pnpm install
   --offline --frozen-lockfile` (pnpm's store warm), each followed by starting `node`.
3. cargo: a clean `cargo build --offline` with `registry/src/INDEX` empty (cargo
   unpacks the crates) against the same build over a `--layout cargo` mount, and over
   the crates already unpacked on disk (so the unpacking's share shows).

Usage: layouts.py WORKDIR OUT.json  (the test fixtures of mount-tests/layouts are built
into WORKDIR/fixtures if missing; needs root, FUSE, node, npm, cargo; installs pnpm).
"""

import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import drop_caches, log, unmount  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKGFS = os.path.join(REPO, "target/release/pkgfs")
N_PACKAGES = 10_000
ROUNDS = 5


def timed(cmd, env=None, cwd=None):
    t = time.monotonic()
    subprocess.run(cmd, check=True, env=env, cwd=cwd,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.monotonic() - t


def summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def daemon_rss_mb(mnt):
    st = json.loads(subprocess.run([PKGFS, "status", "--json", mnt], check=True,
                                   capture_output=True).stdout)
    with open(f"/proc/{st['pid']}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024, st
    return 0.0, st


# ---------------------------------------------------------------- 10,000 archives

def make_store(work):
    """10,000 tarballs without a top directory (as pub.dev ships them), each a few real
    source files taken from cargo's registry sources, a few KiB to tens of KiB."""
    store = os.path.join(work, "store10k")
    stamp = os.path.join(store, ".complete")
    if os.path.exists(stamp):
        return store
    shutil.rmtree(store, ignore_errors=True)
    os.makedirs(store)
    pool = []
    src = os.path.expanduser("~/.cargo/registry/src")
    for root, _, files in os.walk(src):
        for f in files:
            p = os.path.join(root, f)
            if f.endswith((".rs", ".md", ".toml")) and os.path.getsize(p) < 32768:
                pool.append(p)
            if len(pool) >= 20000:
                break
    rng = random.Random(29)
    log(f"writing {N_PACKAGES} tarballs from a pool of {len(pool)} files")
    for i in range(N_PACKAGES):
        name = f"pkg{i:05d}-1.0.{i % 7}"
        with tarfile.open(os.path.join(store, name + ".tar.gz"), "w:gz") as t:
            for j, p in enumerate(rng.sample(pool, 6)):
                t.add(p, arcname=("lib/" if j else "") + f"f{j}-" + os.path.basename(p))
    open(stamp, "w").close()
    return store


def bench_each(work):
    store = make_store(work)
    mnt = os.path.join(work, "mnt-each")
    os.makedirs(mnt, exist_ok=True)
    out = {"packages": N_PACKAGES,
           "store_bytes": sum(os.path.getsize(os.path.join(store, f)) for f in os.listdir(store))}
    one = sorted(os.listdir(store))[N_PACKAGES // 2].removesuffix(".tar.gz")
    for cold in (True, False):
        mounts, rss_mount, enter, rss_enter = [], [], [], []
        for _ in range(ROUNDS):
            if cold:
                drop_caches()
            try:
                mounts.append(timed([PKGFS, "mount", "--layout", "each", "--no-index-cache",
                                     store, mnt]))
                rss, st = daemon_rss_mb(mnt)
                assert st["layout"]["listed"] == N_PACKAGES and st["layout"]["indexed"] == 0, st
                rss_mount.append(rss)
                enter.append(timed(["ls", "-lR", os.path.join(mnt, one)]))
                rss, st = daemon_rss_mb(mnt)
                assert st["layout"]["indexed"] == 1, st["layout"]
                rss_enter.append(rss)
            finally:
                unmount(mnt)
        key = "cold" if cold else "warm"
        out[key] = {"mount_s": summary(mounts), "rss_mb_after_mount": summary(rss_mount),
                    "enter_one_s": summary(enter), "rss_mb_after_one": summary(rss_enter)}
        log(f"each {key}: mount {statistics.median(mounts):.3f} s, "
            f"{statistics.median(rss_mount):.1f} MB; one package "
            f"{statistics.median(enter) * 1000:.1f} ms")
    # Peers, once each, cold: merging indexes every archive (a gzip pass each)...
    drop_caches()
    try:
        t = timed([PKGFS, "mount", "--no-index-cache", "--no-watch", store, mnt])
        rss, _ = daemon_rss_mb(mnt)
    finally:
        unmount(mnt)
    out["merge_cold"] = {"mount_s": t, "rss_mb_after_mount": rss}
    log(f"merge cold: mount {t:.2f} s, {rss:.1f} MB")
    # ... and extracting each into its own directory is what a layout replaces.
    dest = os.path.join(work, "extracted10k")
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    drop_caches()
    t = timed(["bash", "-c",
               f'cd "{store}" && for f in *.tar.gz; do d="{dest}/${{f%.tar.gz}}"; '
               'mkdir "$d" && tar -xzf "$f" -C "$d"; done'])
    out["extract_cold_s"] = t
    log(f"tar -xzf of each, cold: {t:.1f} s")
    shutil.rmtree(dest, ignore_errors=True)
    return out


# ---------------------------------------------------------------- npm

SERVER = """
const express = require('express');
const app = express();
app.get('/', (req, res) => res.send('hello from ' + require('express/package.json').version));
const s = app.listen(0, '127.0.0.1', () => console.log(s.address().port));
"""


def first_answer(proj):
    """Start the app and wait for its first HTTP answer; the seconds it took."""
    t = time.monotonic()
    p = subprocess.Popen(["node", "server.js"], cwd=proj, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(p.stdout.readline())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as r:
            assert r.read().startswith(b"hello from 4."), "the app answered"
        return time.monotonic() - t
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait()


def npm_env(work):
    env = dict(os.environ)
    env.update({"npm_config_userconfig": os.path.join(work, "npmrc"),
                "npm_config_cache": os.path.join(work, "npm-cache"),
                "npm_config_update_notifier": "false", "npm_config_fund": "false",
                "npm_config_audit": "false"})
    return env


# A larger project: the same express app, with the development tools a project of this
# kind carries (which `npm ci` installs and the app never loads).
LARGE = {"name": "bench-large", "version": "1.0.0", "private": True,
         "dependencies": {"express": "4.21.2"},
         "devDependencies": {"typescript": "5.6.3", "eslint": "9.15.0", "webpack": "5.96.1",
                             "jest": "29.7.0", "@babel/core": "7.26.0", "prettier": "3.3.3"}}


def make_large(work):
    """The larger project's lockfile (one online `npm install`) and every locked
    package's tarball (`npm pack NAME@VERSION`, one call), made once."""
    base = os.path.join(work, "npm-large-src")
    proj, tarballs = os.path.join(base, "project"), os.path.join(base, "tarballs")
    if os.path.exists(os.path.join(base, ".complete")):
        return proj, tarballs
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(proj)
    os.makedirs(tarballs)
    with open(os.path.join(proj, "package.json"), "w") as f:
        json.dump(LARGE, f)
    env = npm_env(work)
    open(env["npm_config_userconfig"], "w").close()
    subprocess.run(["npm", "install", "--ignore-scripts", "--package-lock-only"], cwd=proj,
                   env=env, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(proj, "package-lock.json")) as f:
        locked = json.load(f)["packages"]
    specs = sorted({f"{v.get('name') or k.rsplit('node_modules/', 1)[1]}@{v['version']}"
                    for k, v in locked.items()
                    if k and not v.get("link") and not v.get("inBundle")})
    subprocess.run(["npm", "pack", "--silent", *specs], cwd=tarballs, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    open(os.path.join(base, ".complete"), "w").close()
    return proj, tarballs


def bench_npm(work, src_project, tarballs, label):
    env = npm_env(work)
    open(env["npm_config_userconfig"], "w").close()
    lock = os.path.join(src_project, "package-lock.json")
    base = os.path.join(work, label)
    shutil.rmtree(base, ignore_errors=True)
    projects = {}
    for who in ("pkgfs", "npm", "pnpm"):
        d = os.path.join(base, who)
        os.makedirs(d)
        shutil.copy(os.path.join(src_project, "package.json"), d)
        shutil.copy(lock, d)
        with open(os.path.join(d, "server.js"), "w") as f:
            f.write(SERVER)
        projects[who] = d
    # npm's cache holds the tarballs (warm, as on a developer's machine).
    subprocess.run(["bash", "-c", f'npm cache add "{tarballs}"/*.tgz'], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    # pnpm: its lockfile imported from npm's, its store warmed by one install.
    if not shutil.which("pnpm"):
        subprocess.run(["npm", "install", "-g", "pnpm@9"], check=True,
                       stdout=subprocess.DEVNULL)
    pn = projects["pnpm"]
    subprocess.run(["pnpm", "import"], cwd=pn, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["pnpm", "install", "--frozen-lockfile", "--ignore-scripts"], cwd=pn,
                   check=True, stdout=subprocess.DEVNULL)
    pnpm_store = subprocess.run(["pnpm", "store", "path"], cwd=pn, check=True,
                                capture_output=True, text=True).stdout.strip()
    runs = {"pkgfs": [], "pkgfs_index_cached": [], "npm ci": [], "pnpm": []}
    mount_only = []
    for _ in range(ROUNDS):
        for who in runs:
            drop_caches()
            t = time.monotonic()
            if who.startswith("pkgfs"):
                proj = projects["pkgfs"]
                nm = os.path.join(proj, "node_modules")
                os.makedirs(nm, exist_ok=True)
                cache = [] if who == "pkgfs_index_cached" else ["--no-index-cache"]
                try:
                    subprocess.run([PKGFS, "mount", "--no-watch", "--layout", "npm",
                                    "--lockfile", os.path.join(proj, "package-lock.json"),
                                    *cache, tarballs, nm], check=True,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    if who == "pkgfs":
                        mount_only.append(time.monotonic() - t)
                    first_answer(proj)
                    runs[who].append(time.monotonic() - t)
                finally:
                    unmount(nm)
            elif who == "npm ci":
                proj = projects["npm"]
                shutil.rmtree(os.path.join(proj, "node_modules"), ignore_errors=True)
                t = time.monotonic()
                subprocess.run(["npm", "ci", "--offline", "--ignore-scripts"], cwd=proj,
                               env=env, check=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
                first_answer(proj)
                runs[who].append(time.monotonic() - t)
            else:
                shutil.rmtree(os.path.join(pn, "node_modules"), ignore_errors=True)
                t = time.monotonic()
                subprocess.run(["pnpm", "install", "--offline", "--frozen-lockfile",
                                "--ignore-scripts", "--store-dir", pnpm_store], cwd=pn,
                               check=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
                first_answer(pn)
                runs[who].append(time.monotonic() - t)
    with open(lock) as f:
        packages = sum(1 for k in json.load(f)["packages"] if k)
    files = int(subprocess.run(["bash", "-c", f'find "{projects["npm"]}/node_modules" -type f '
                                "| wc -l"], capture_output=True, text=True).stdout)
    out = {"packages": packages, "files": files, "pkgfs_mount_s": summary(mount_only)}
    for who, xs in runs.items():
        out[who] = summary(xs)
        log(f"{label}, {who}: first answer after {statistics.median(xs):.3f} s")
    out["ratio_npm_ci_over_pkgfs"] = (statistics.median(runs["npm ci"])
                                     / statistics.median(runs["pkgfs"]))
    out["ratio_pnpm_over_pkgfs"] = (statistics.median(runs["pnpm"])
                                   / statistics.median(runs["pkgfs"]))
    return out


# ---------------------------------------------------------------- cargo

def bench_cargo(work, fx):
    index = open(os.path.join(fx, "cargo/index.txt")).read().strip()
    home = os.path.join(work, "cargo-home")
    shutil.rmtree(home, ignore_errors=True)
    shutil.copytree(os.path.join(fx, "cargo/home"), home, symlinks=True)
    crate = os.path.join(work, "cargo-crate")
    shutil.rmtree(crate, ignore_errors=True)
    shutil.copytree(os.path.join(fx, "cargo/crate"), crate)
    src = os.path.join(home, "registry/src", index)
    cache = os.path.join(home, "registry/cache", index)
    env = dict(os.environ, CARGO_HOME=home)
    crates = len([f for f in os.listdir(cache) if f.endswith(".crate")])

    def build():
        target = os.path.join(work, "cargo-target")
        shutil.rmtree(target, ignore_errors=True)
        return timed(["cargo", "build", "--offline", "--locked", "-j2",
                      "--target-dir", target], env=env, cwd=crate)

    runs = {"unpacking": [], "unpacked": [], "pkgfs": []}
    for _ in range(3):
        for who in runs:
            shutil.rmtree(src, ignore_errors=True)
            if who == "unpacked":
                shutil.copytree(os.path.join(fx, "cargo/unpacked"), src)
            os.makedirs(src, exist_ok=True)
            drop_caches()
            if who == "pkgfs":
                t = time.monotonic()
                try:
                    subprocess.run([PKGFS, "mount", "--no-watch", "--layout", "cargo", cache,
                                    src], check=True, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
                    build()
                    runs[who].append(time.monotonic() - t)
                finally:
                    unmount(src)
            else:
                runs[who].append(build())
    out = {"crates": crates}
    for who, xs in runs.items():
        out[who] = summary(xs)
        log(f"cargo build, {who}: {statistics.median(xs):.1f} s")
    out["unpacking_s"] = (statistics.median(runs["unpacking"])
                          - statistics.median(runs["unpacked"]))
    out["ratio_pkgfs_over_unpacked"] = (statistics.median(runs["pkgfs"])
                                        / statistics.median(runs["unpacked"]))
    return out


def main():
    work, out_path = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    fx = os.path.join(work, "fixtures")
    subprocess.run(["bash", os.path.join(REPO, "mount-tests/layouts/make_layout_fixtures.sh"),
                    fx], check=True)
    results = {
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                    "node": subprocess.run(["node", "--version"], capture_output=True,
                                           text=True).stdout.strip(),
                    "npm": subprocess.run(["npm", "--version"], capture_output=True,
                                          text=True).stdout.strip(),
                    "cargo": subprocess.run(["cargo", "--version"], capture_output=True,
                                            text=True).stdout.strip()},
    }
    only = sys.argv[3:] or ["each", "npm", "npm-large", "cargo"]
    if "each" in only:
        results["each"] = bench_each(work)
    if "npm" in only:
        results["npm"] = bench_npm(work, os.path.join(fx, "npm/project"),
                                   os.path.join(fx, "npm/tarballs"), "npm")
    if "npm-large" in only:
        results["npm_large"] = bench_npm(work, *make_large(work), "npm-large")
    if "npm" in only or "npm-large" in only:
        results["machine"]["pnpm"] = subprocess.run(["pnpm", "--version"], capture_output=True,
                                                    text=True).stdout.strip()
    if "cargo" in only:
        results["cargo"] = bench_cargo(work, fx)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)
    log(f"written {out_path}")


if __name__ == "__main__":
    main()
