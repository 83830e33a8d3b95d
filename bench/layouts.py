#!/usr/bin/env python3
"""Layouts benchmark (`just bench-layouts`): one run, pkgfs and its peers side by side.

1. 10,000 archives (8,000 `tar -czf`, 2,000 `zip -qr`, of small real trees of this
   machine) mounted with `--layout each`: time until `pkgfs mount` returns and the
   daemon's memory, cold and warm; entering one package of each kind; against `pkgfs
   mount` merging (and so indexing) all of them, and against extracting each into its
   own directory with `tar -xzf` / `unzip`, the step a layout saves.
2. npm: from nothing to the first HTTP answer of an express app: `pkgfs mount --layout
   npm --lockfile` against `npm ci --offline` (npm's cache warm) and `pnpm install
   --offline --frozen-lockfile` (pnpm's store warm), each followed by starting `node`;
   node alone over the installed tree is the floor. The mount tests' project, and a
   larger one (the same app with a project's development tools).
3. cargo: a clean `cargo build --offline -j2` with `registry/src/INDEX` empty (cargo
   unpacks the crates) against the same build over a `--layout cargo` mount, and over
   the crates already unpacked on disk (so the unpacking's share shows); the mount
   tests' crate (15 crates) and a larger graph (clap and serde with derive, regex...).

Usage: layouts.py WORKDIR OUT.json [SECTION ...]  (sections: each npm npm-large cargo
cargo-large, all by default; with some, the others' results are kept in OUT.json; the
test fixtures of mount-tests/layouts are built
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
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import drop_caches, log, unmount  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKGFS = os.path.join(REPO, "target/release/pkgfs")
N_PACKAGES = 10_000
ROUNDS = 5


def timed(cmd, env=None, cwd=None):
    t = time.monotonic()
    r = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if r.returncode:
        log(r.stderr.decode(errors="replace")[-4000:])
        r.check_returncode()
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

TREE_SOURCES = ["~/.cargo/registry/src", "/usr/share/doc", "/usr/lib/python3",
                "/usr/lib/python3.11", "/usr/lib/node_modules", "/usr/include",
                "/usr/share/perl5", "/usr/share/man"]


def small_trees():
    """Real directories of this machine holding 2 to 40 regular files, 2 KB to 200 KB in
    all (crate sources, Debian docs, Python and node modules, headers)."""
    trees = []
    for base in TREE_SOURCES:
        base = os.path.expanduser(base)
        for root, _, files in os.walk(base):
            if not files:
                continue
            size = count = 0
            for r, _, fs in os.walk(root):
                for f in fs:
                    q = os.path.join(r, f)
                    if os.path.isfile(q) and not os.path.islink(q):
                        size += os.path.getsize(q)
                        count += 1
                if count > 40 or size > 200_000:
                    break
            if 2 <= count <= 40 and 2000 <= size <= 200_000:
                trees.append(root)
    return sorted(trees)


def archive_name(i):
    """pkg-00000 … pkg-09999: every fifth (i % 5 == 4) a ZIP, the others gzip tarballs."""
    return f"pkg-{i:05d}" + (".zip" if i % 5 == 4 else ".tar.gz")


def make_store(work):
    """10,000 archives of small real trees, made by the tools users make them with:
    `tar -czf` (8,000) and `zip -qr` (2,000), each holding one top directory (as npm's
    `package/` or a crate's `NAME-VERSION/`), the trees taken in turn from small_trees()."""
    store = os.path.join(work, "store10k-mix")
    stamp = os.path.join(store, ".complete")
    if os.path.exists(stamp):
        return store
    shutil.rmtree(store, ignore_errors=True)
    os.makedirs(store)
    trees = small_trees()
    random.Random(29).shuffle(trees)
    log(f"writing {N_PACKAGES} archives (tar -czf, zip -qr) of {len(trees)} real trees")

    def one(i):
        tree = trees[i % len(trees)]
        name = archive_name(i)
        dst = os.path.join(store, name)
        parent, base = os.path.split(tree)
        if name.endswith(".zip"):
            cmd = ["zip", "-qr", dst, base]
        else:
            cmd = ["tar", "-czf", dst, base]
        subprocess.run(cmd, cwd=parent, check=True, stderr=subprocess.DEVNULL)

    with ThreadPoolExecutor(os.cpu_count() or 2) as ex:
        list(ex.map(one, range(N_PACKAGES)))
    open(stamp, "w").close()
    return store


def enter(mnt, name):
    """`ls -lR` of one package: its index is read (a gzip pass, or a ZIP's central
    directory) and every entry listed and stat'ed."""
    return timed(["ls", "-lR", os.path.join(mnt, name)])


def bench_each(work):
    store = make_store(work)
    mnt = os.path.join(work, "mnt-each")
    os.makedirs(mnt, exist_ok=True)
    names = sorted(f for f in os.listdir(store) if not f.startswith("."))
    out = {"packages": N_PACKAGES,
           "zip": sum(f.endswith(".zip") for f in names),
           "tar_gz": sum(f.endswith(".tar.gz") for f in names),
           "store_bytes": sum(os.path.getsize(os.path.join(store, f)) for f in names),
           "entered": ["pkg-05000 (tar.gz)", "pkg-05004 (zip)"]}
    for cold in (True, False):
        mounts, rss_mount, ent, rss_ent, ent_zip, rss_zip = [], [], [], [], [], []
        for _ in range(ROUNDS):
            if cold:
                drop_caches()
            try:
                mounts.append(timed([PKGFS, "mount", "--layout", "each", "--no-index-cache",
                                     store, mnt]))
                rss, st = daemon_rss_mb(mnt)
                assert st["layout"]["listed"] == N_PACKAGES and st["layout"]["indexed"] == 0, st
                rss_mount.append(rss)
                ent.append(enter(mnt, "pkg-05000"))
                rss, st = daemon_rss_mb(mnt)
                assert st["layout"]["indexed"] == 1, st["layout"]
                rss_ent.append(rss)
                ent_zip.append(enter(mnt, "pkg-05004"))
                rss, st = daemon_rss_mb(mnt)
                assert st["layout"]["indexed"] == 2 and st["layout"]["failed"] == 0, st["layout"]
                rss_zip.append(rss)
            finally:
                unmount(mnt)
        key = "cold" if cold else "warm"
        out[key] = {"mount_s": summary(mounts), "rss_mb_after_mount": summary(rss_mount),
                    "enter_targz_s": summary(ent), "rss_mb_after_one": summary(rss_ent),
                    "enter_zip_s": summary(ent_zip), "rss_mb_after_two": summary(rss_zip)}
        log(f"each {key}: mount {statistics.median(mounts):.3f} s, "
            f"{statistics.median(rss_mount):.1f} MB; one tar.gz "
            f"{statistics.median(ent) * 1000:.1f} ms, one zip "
            f"{statistics.median(ent_zip) * 1000:.1f} ms, {statistics.median(rss_zip):.1f} MB")
    # Peers, cold, in the same run: merging indexes every archive (a gzip pass each,
    # a ZIP's central directory)...
    merge, merge_rss = [], []
    for _ in range(3):
        drop_caches()
        try:
            merge.append(timed([PKGFS, "mount", "--no-index-cache", "--no-watch", store, mnt]))
            rss, _ = daemon_rss_mb(mnt)
            merge_rss.append(rss)
        finally:
            unmount(mnt)
    out["merge_cold"] = {"mount_s": summary(merge), "rss_mb_after_mount": summary(merge_rss)}
    log(f"merge cold: mount {statistics.median(merge):.2f} s, "
        f"{statistics.median(merge_rss):.1f} MB")
    # ... and extracting each into its own directory is what a layout replaces.
    dest = os.path.join(work, "extracted10k")
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    drop_caches()
    t = timed(["bash", "-c",
               f'cd "{store}" && for f in *.tar.gz *.zip; do n="${{f%.tar.gz}}"; '
               f'n="${{n%.zip}}"; d="{dest}/$n"; mkdir "$d" && case "$f" in '
               '*.zip) unzip -q "$f" -d "$d";; *) tar -xzf "$f" -C "$d";; esac; done'])
    out["extract_cold_s"] = t
    out["extracted_bytes"] = int(subprocess.run(["du", "-sb", dest], capture_output=True,
                                                text=True).stdout.split()[0])
    log(f"tar -xzf / unzip of each, cold: {t:.1f} s")
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
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
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
    mount_only, floor = [], []
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
                # The floor: node alone over the tree npm ci left on disk, cold.
                drop_caches()
                floor.append(first_answer(proj))
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
    out = {"packages": packages, "files": files, "pkgfs_mount_s": summary(mount_only),
           "node_over_npm_ci_tree_cold": summary(floor)}
    log(f"{label}: pkgfs mount {statistics.median(mount_only):.3f} s; node alone over the "
        f"npm ci tree, cold: {statistics.median(floor):.3f} s")
    for who, xs in runs.items():
        out[who] = summary(xs)
        log(f"{label}, {who}: first answer after {statistics.median(xs):.3f} s")
    out["ratio_npm_ci_over_pkgfs"] = (statistics.median(runs["npm ci"])
                                     / statistics.median(runs["pkgfs"]))
    out["ratio_pnpm_over_pkgfs"] = (statistics.median(runs["pnpm"])
                                   / statistics.median(runs["pkgfs"]))
    return out


# ---------------------------------------------------------------- cargo

# A larger crate graph than the mount tests' (15 crates): a command-line tool's usual
# dependencies, with the derive macros (syn, quote, proc-macro2) that most graphs have.
CARGO_LARGE_TOML = """[package]
name = "bench-layouts-cargo"
version = "0.1.0"
edition = "2021"
publish = false

[dependencies]
anyhow = "1"
clap = { version = "4", features = ["derive"] }
indexmap = "2"
itoa = "1"
log = "0.4"
once_cell = "1"
regex = "1"
serde = { version = "1", features = ["derive"] }
serde_json = "1"
smallvec = "1"
thiserror = "2"

[workspace]
"""

CARGO_LARGE_MAIN = """use clap::Parser;
use serde::{Deserialize, Serialize};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "a+b")]
    pattern: String,
}

#[derive(Serialize, Deserialize, Debug)]
struct Hit {
    at: usize,
    text: String,
}

#[derive(thiserror::Error, Debug)]
#[error("nothing matched")]
struct NoMatch;

static TEXT: once_cell::sync::Lazy<String> = once_cell::sync::Lazy::new(|| "xaabyab".into());

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let re = regex::Regex::new(&args.pattern)?;
    let mut hits: smallvec::SmallVec<[Hit; 4]> = smallvec::SmallVec::new();
    let mut seen = indexmap::IndexMap::new();
    for m in re.find_iter(&TEXT) {
        *seen.entry(m.as_str().to_string()).or_insert(0) += 1;
        hits.push(Hit { at: m.start(), text: m.as_str().into() });
    }
    if hits.is_empty() {
        return Err(NoMatch.into());
    }
    log::info!("{} distinct", seen.len());
    let mut buf = itoa::Buffer::new();
    println!("{} {}", buf.format(hits.len()), serde_json::to_string(&hits[..])?);
    Ok(())
}
"""


def make_cargo_large(work):
    """The larger crate graph laid out as the fixtures' cargo part: crate/ (its lockfile
    made once, online), home/ (a CARGO_HOME after `cargo fetch`, registry/src/INDEX
    emptied), unpacked/ (what cargo fetch unpacked there), index.txt."""
    base = os.path.join(work, "cargo-large-src")
    if os.path.exists(os.path.join(base, ".complete")):
        return base
    shutil.rmtree(base, ignore_errors=True)
    crate, home = os.path.join(base, "crate"), os.path.join(base, "home")
    os.makedirs(os.path.join(crate, "src"))
    os.makedirs(home)
    with open(os.path.join(crate, "Cargo.toml"), "w") as f:
        f.write(CARGO_LARGE_TOML)
    with open(os.path.join(crate, "src/main.rs"), "w") as f:
        f.write(CARGO_LARGE_MAIN)
    env = dict(os.environ, CARGO_HOME=home)
    env.pop("CARGO_TARGET_DIR", None)
    subprocess.run(["cargo", "generate-lockfile", "--quiet"], cwd=crate, env=env, check=True)
    subprocess.run(["cargo", "fetch", "--locked", "--quiet"], cwd=crate, env=env, check=True)
    index = os.listdir(os.path.join(home, "registry/cache"))[0]
    with open(os.path.join(base, "index.txt"), "w") as f:
        f.write(index + "\n")
    src = os.path.join(home, "registry/src", index)
    shutil.move(src, os.path.join(base, "unpacked"))
    os.makedirs(src)
    for d in (".package-cache", ".package-cache-mutate", ".global-cache"):
        p = os.path.join(home, d)
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.remove(p)
    open(os.path.join(base, ".complete"), "w").close()
    return base


def bench_cargo(work, fx, label):
    """fx holds crate/, home/, unpacked/ and index.txt (the fixtures' cargo part or
    make_cargo_large's)."""
    index = open(os.path.join(fx, "index.txt")).read().strip()
    home = os.path.join(work, label + "-home")
    shutil.rmtree(home, ignore_errors=True)
    shutil.copytree(os.path.join(fx, "home"), home, symlinks=True)
    crate = os.path.join(work, label + "-crate")
    shutil.rmtree(crate, ignore_errors=True)
    shutil.copytree(os.path.join(fx, "crate"), crate)
    src = os.path.join(home, "registry/src", index)
    cache = os.path.join(home, "registry/cache", index)
    env = dict(os.environ, CARGO_HOME=home)
    env.pop("CARGO_TARGET_DIR", None)
    crate_files = sorted(f for f in os.listdir(cache) if f.endswith(".crate"))
    target = os.path.join(work, label + "-target")

    def build():
        shutil.rmtree(target, ignore_errors=True)
        return timed(["cargo", "build", "--offline", "--locked", "-j2",
                      "--target-dir", target], env=env, cwd=crate)

    runs = {"unpacking": [], "unpacked": [], "pkgfs": []}
    mount_only, untar = [], []
    for _ in range(3):
        for who in runs:
            shutil.rmtree(src, ignore_errors=True)
            if who == "unpacked":
                shutil.copytree(os.path.join(fx, "unpacked"), src)
            os.makedirs(src, exist_ok=True)
            drop_caches()
            if who == "pkgfs":
                t = time.monotonic()
                try:
                    subprocess.run([PKGFS, "mount", "--no-watch", "--layout", "cargo", cache,
                                    src], check=True, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
                    mount_only.append(time.monotonic() - t)
                    build()
                    runs[who].append(time.monotonic() - t)
                finally:
                    unmount(src)
            else:
                runs[who].append(build())
        # The unpacking alone, cold, as tar would do it: every .crate into src.
        shutil.rmtree(src, ignore_errors=True)
        os.makedirs(src)
        drop_caches()
        t = time.monotonic()
        for c in crate_files:
            subprocess.run(["tar", "-xzf", os.path.join(cache, c), "-C", src], check=True)
        untar.append(time.monotonic() - t)
        shutil.rmtree(src, ignore_errors=True)
        os.makedirs(src)
    # What was compiled: the packages cargo built (a platform's dependencies only).
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--offline", "--locked", "--format-version", "1",
         "--filter-platform", platform.machine() + "-unknown-linux-gnu"],
        env=env, cwd=crate, check=True, capture_output=True).stdout)
    out = {"crates_fetched": len(crate_files),
           "crates_built": sum(1 for n in meta["resolve"]["nodes"]) - 1,
           "unpacked_bytes": int(subprocess.run(["du", "-sb", os.path.join(fx, "unpacked")],
                                                capture_output=True, text=True
                                                ).stdout.split()[0]),
           "pkgfs_mount_s": summary(mount_only), "tar_xzf_every_crate_cold_s": summary(untar)}
    for who, xs in runs.items():
        out[who] = summary(xs)
        log(f"{label} build, {who}: {statistics.median(xs):.1f} s")
    out["unpacking_s"] = (statistics.median(runs["unpacking"])
                          - statistics.median(runs["unpacked"]))
    out["ratio_pkgfs_over_unpacked"] = (statistics.median(runs["pkgfs"])
                                        / statistics.median(runs["unpacked"]))
    log(f"{label}: {out['crates_built']} crates built of {len(crate_files)} fetched; "
        f"unpacking {out['unpacking_s']:.2f} s by difference, tar -xzf of every crate "
        f"{statistics.median(untar):.2f} s; pkgfs/unpacked {out['ratio_pkgfs_over_unpacked']:.3f}")
    return out


def version(cmd):
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()


SECTIONS = ["each", "npm", "npm-large", "cargo", "cargo-large"]


def main():
    work, out_path = sys.argv[1], sys.argv[2]
    only = sys.argv[3:] or SECTIONS
    os.makedirs(work, exist_ok=True)
    fx = os.path.join(work, "fixtures")
    subprocess.run(["bash", os.path.join(REPO, "mount-tests/layouts/make_layout_fixtures.sh"),
                    fx], check=True)
    results = {}
    if sys.argv[3:] and os.path.exists(out_path):
        # Some sections only: the others' results are kept from the earlier run.
        with open(out_path) as f:
            results = json.load(f)
    results["machine"] = {
        "cpus": os.cpu_count(), "kernel": platform.release(),
        "node": version(["node", "--version"]), "npm": version(["npm", "--version"]),
        "cargo": version(["cargo", "--version"])}
    build = version(["git", "-C", REPO, "rev-parse", "--short", "HEAD"])
    runs = {
        "each": lambda: bench_each(work),
        "npm": lambda: bench_npm(work, os.path.join(fx, "npm/project"),
                                 os.path.join(fx, "npm/tarballs"), "npm"),
        "npm-large": lambda: bench_npm(work, *make_large(work), "npm-large"),
        "cargo": lambda: bench_cargo(work, os.path.join(fx, "cargo"), "cargo"),
        "cargo-large": lambda: bench_cargo(work, make_cargo_large(work), "cargo-large"),
    }
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    try:
        for section in SECTIONS:
            if section not in only:
                continue
            r = runs[section]()
            r["date"] = time.strftime("%Y-%m-%d %H:%M")
            r["build"] = build
            results[section.replace("-", "_")] = r
            if section.startswith("npm"):
                results["machine"]["pnpm"] = version(["pnpm", "--version"])
            with open(out_path, "w") as f:  # after every section: a failure keeps the rest
                json.dump(results, f, indent=1)
            log(f"written {out_path} ({section})")
    finally:
        # Whatever failed, no mount of this benchmark is left behind.
        with open("/proc/self/mounts") as f:
            left = [l.split(" ")[1] for l in f if l.split(" ")[1].startswith(work.rstrip("/") + "/")]
        for mnt in left:
            unmount(mnt)


if __name__ == "__main__":
    main()
