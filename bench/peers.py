#!/usr/bin/env python3
"""The peer benchmark of issue 5: pkgfs against squashfuse_ll, the kernel's squashfs,
fuse-zip, ratarmount, archivemount and the extracted tree, on the Linux 6.1 source,
all measured in one run on one machine. Run through bench/peers.sh (which prepares the
corpus and installs the peers).

    peers.py WORKDIR OUT.json [--only SYSTEM,...] [--merge] [--skip-scaling] [--quick]
             [--rounds N] [--dev-fuse]
--rounds N (default 3, 0 with --quick): after every system has been measured, N more
rounds for each system that read everything in under 30 s, interleaved system by
system, so a slow minute of this shared machine lands on every system alike: a cold
mount, a cold read-all, then warm: the read-all again, find, stat. The report gives the
median of all of a system's measurements of these, and ratios round by round.
--merge keeps the other systems' results (and the scaling run, with --skip-scaling)
already in OUT.json: to remeasure pkgfs after a change without rerunning every peer.
Each system's results carry the time they were measured; the report says when a table
mixes runs. pkgfs runs over FUSE over io_uring (the kernel's fuse.enable_uring is switched
on for the run and back after) unless --dev-fuse is given; each pkgfs result records the
transport `pkgfs status` reported.

Workloads (each system, each in a fresh mount where "cold" matters, page cache dropped):
  mount      time until the mountpoint lists (cold)
  find1/2    `find -size +0` over the whole tree, just after mounting and again
  stat       lstat of every path (after the finds: the kernel caches should answer), best of 3
  read1/2    every file read (`tar cf - . > /dev/zero`, the issue's own example; GNU
             tar skips reading only when the archive is /dev/null), cold, then warm
  small      2,000 random files under 16 KiB read whole, cold: per-file latency
  large_seq  the largest file (24 MB) read sequentially, cold
  large_rand 200 random 4 KiB preads in that file, cold mount
  huge_rand  200 random 4 KiB preads in a 1 GiB member, cold mount
  rss        peak resident memory of the daemon over its mounts
and a scaling run of pkgfs alone: 1,000 to 10,000 generated packages, up to 1,000,000
entries: mount time and RSS against the number of entries.
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
from common import drop_caches, log  # noqa: E402
import zipfile

WORK = sys.argv[1]
OUT = sys.argv[2]
ARGS = sys.argv[3:]
ONLY = None
if "--only" in ARGS:
    ONLY = set(ARGS[ARGS.index("--only") + 1].split(","))
QUICK = "--quick" in ARGS
# Names this invocation: systems of one invocation share its interleaved rounds.
RUN = time.strftime("%Y-%m-%d %H:%M")
ROUNDS = int(ARGS[ARGS.index("--rounds") + 1]) if "--rounds" in ARGS else (0 if QUICK else 3)
# Systems slower than this at reading everything are far from the others: one run is enough.
ROUNDS_UNDER = 30
MERGE = "--merge" in ARGS
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKGFS = os.path.join(HERE, "target/release/pkgfs")
VENV = os.path.join(HERE, "target/bench-venv/bin")
MNT = os.path.join(WORK, "mnt")
SRC = os.path.join(WORK, "linux")
TIMEOUT = 900
# Per-workload limit: a peer that needs longer (archivemount reads a zip from its start
# for every file) is reported as over the limit, with what it managed in that time.
LIMIT = 180


def sh(cmd, timeout=TIMEOUT, check=True):
    return subprocess.run(["bash", "-c", cmd], timeout=timeout, check=check,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def unmount():
    common.unmount(MNT)


def pids(pattern):
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return [int(p) for p in out.split() if int(p) != os.getpid()]


def hwm_kb(pattern):
    total = 0
    for pid in pids(pattern):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


class System:
    def __init__(self, key, name, mount, daemon=None, tree=None):
        self.key, self.name, self.mount_cmd, self.daemon = key, name, mount, daemon
        self.tree = tree  # path inside the mount where the tree starts
        self.peak_kb = 0

    def root(self):
        return os.path.join(MNT, self.tree) if self.tree else MNT

    def mount(self):
        unmount()
        drop_caches()
        t0 = time.monotonic()
        sh(self.mount_cmd)
        while True:
            try:
                if os.listdir(self.root()):
                    break
            except OSError:
                pass
            if time.monotonic() - t0 > TIMEOUT:
                raise RuntimeError(self.key + ": mount never answered")
            time.sleep(0.005)
        return time.monotonic() - t0

    def note_rss(self):
        if self.daemon:
            self.peak_kb = max(self.peak_kb, hwm_kb(self.daemon))

    def done(self):
        self.note_rss()
        unmount()
        # A daemon still running after its unmount (archivemount, lazily unmounted while
        # it decompresses for a reader stopped at the time limit, spun on a core for half
        # an hour) would slow every later measurement: give it a moment, then kill it.
        if self.daemon:
            deadline = time.monotonic() + 5
            while pids(self.daemon) and time.monotonic() < deadline:
                time.sleep(0.1)
            for pid in pids(self.daemon):
                print(f"{self.key}: daemon {pid} still running after unmount: killed",
                      file=sys.stderr)
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass


def timed(fn):
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def percentiles(xs):
    xs = sorted(xs)
    q = lambda p: xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]
    return {"p50_ms": q(0.5) * 1000, "p99_ms": q(0.99) * 1000,
            "mean_ms": statistics.mean(xs) * 1000}


def tolerant(cmd, r):
    """Run a workload command; a peer that reports errors on some files is still timed,
    and the failure is recorded with the result. Past LIMIT it is stopped and recorded."""
    try:
        p = sh(cmd, timeout=LIMIT, check=False)
    except subprocess.TimeoutExpired:
        r.setdefault("timeouts", []).append(cmd.split(";")[-1].split()[0])
        return
    if p.returncode != 0:
        r.setdefault("errors", []).append(f"{cmd.split()[0]}: exit {p.returncode}: "
                                          + p.stderr.decode(errors="replace")[-200:])


def timed_cmd(cmd, r):
    """Seconds a workload command took, or None if it ran past LIMIT."""
    before = len(r.get("timeouts", []))
    t = timed(lambda: tolerant(cmd, r))
    return None if len(r.get("timeouts", [])) > before else t


def read_all(s):
    return f"tar -C '{s.root()}' -cf - . > /dev/zero"


def stat_paths(root):
    """Every path under root (listing them warms the kernel's caches)."""
    paths = []
    for d, dirs, files in os.walk(root):
        paths.extend(os.path.join(d, n) for n in dirs + files)
    return paths


def stat_best(paths, r):
    """lstat of every path, best of three: warm and CPU-bound, so a moment of noise on
    this 2-core machine is not measured (it moved the ratio between 1.06x and 1.80x)."""
    def stat_all():
        for p in paths:
            try:
                os.lstat(p)
            except OSError as e:
                r.setdefault("errors", []).append(f"lstat: {e}")
    return min(timed(stat_all) for _ in range(3))


# Workloads measured again in every round, and reported as medians: the cold ones, and
# the warm ones whose target is a ratio to kernel squashfs (a system measured minutes
# after another meets another speed of this machine, by up to 2x).
ROUND_KEYS = ("mount", "read1", "read2", "find2", "stat")


def cold_rounds(measured, results):
    """ROUNDS more cold mounts and read-alls of each fast system, interleaved system by
    system, each followed by the warm workloads (read-all again, find, stat)."""
    fast = [s for s in measured
            if (results["systems"][s.key].get("read1") or ROUNDS_UNDER) < ROUNDS_UNDER]
    for i in range(ROUNDS):
        for s in fast:
            r = results["systems"][s.key]
            log(f"== round {i + 1}: {s.name}")
            r.setdefault("mount_rounds", []).append(s.mount())  # cold: caches dropped first
            drop_caches()
            t = timed_cmd(read_all(s), r)
            r.setdefault("read1_rounds", []).append(t)
            r.setdefault("read2_rounds", []).append(timed_cmd(read_all(s), r))
            r.setdefault("find2_rounds", []).append(
                timed_cmd(f"find '{s.root()}' -size +0 > /dev/null", r))
            r.setdefault("stat_rounds", []).append(stat_best(stat_paths(s.root()), r))
            s.done()
    for s in fast:
        r = results["systems"][s.key]
        for key in ROUND_KEYS:
            runs = [t for t in [r.get(key)] + r.get(f"{key}_rounds", []) if t is not None]
            if runs:
                r[f"{key}_median"] = statistics.median(runs)


def run_workloads(s, small_files, large_rel, huge=None):
    r = {}
    root = s.root
    if s.key == "pkgfs-targz":
        # The first mount ever indexes every tarball (and fills the cache); measured on
        # its own, with nothing cached.
        shutil.rmtree(TARGZ_INDEX, ignore_errors=True)
        r["mount_first"] = s.mount()
        s.done()
    # Session 1: mount, metadata.
    r["mount"] = s.mount()
    r["find1"] = timed_cmd(f"find '{root()}' -size +0 > /dev/null", r)
    r["find2"] = timed_cmd(f"find '{root()}' -size +0 > /dev/null", r)
    paths = stat_paths(root())
    r["stat"] = stat_best(paths, r)
    r["entries"] = len(paths)
    s.done()
    # Session 2: read everything, cold then warm.
    s.mount()
    drop_caches()
    r["read1"] = timed_cmd(read_all(s), r)
    r["read2"] = timed_cmd(read_all(s), r) if r["read1"] is not None else None
    if s.key.startswith("pkgfs"):
        r["transport"] = transport()
    s.done()
    # Session 3: random small files, cold.
    s.mount()
    drop_caches()
    lat = []
    start = time.monotonic()
    for rel in small_files:
        if time.monotonic() - start > LIMIT:
            r.setdefault("timeouts", []).append(f"small files ({len(lat)} read)")
            break
        t0 = time.monotonic()
        try:
            with open(os.path.join(root(), rel), "rb") as f:
                f.read()
        except OSError as e:
            r.setdefault("errors", []).append(f"read {rel}: {e}")
        lat.append(time.monotonic() - t0)
    r["small"] = percentiles(lat)
    r["small"]["total_s"] = sum(lat)
    s.done()
    # Session 4: the largest file, sequential then random, each cold.
    big = os.path.join(root(), large_rel)
    s.mount()
    drop_caches()
    size = os.path.getsize(big)
    t = timed_cmd(f"cat '{big}' > /dev/null", r)
    r["large_seq"] = size / t / 1e6 if t else None
    s.done()
    s.mount()
    drop_caches()
    r["large_rand"] = random_preads(big, size, 200)
    s.done()
    if huge:
        s_h, rel = huge
        s_h.mount()
        drop_caches()
        path = os.path.join(s_h.root(), rel)
        r["huge_rand"] = random_preads(path, os.path.getsize(path), 200)
        s_h.note_rss()
        s_h.done()
        s.peak_kb = max(s.peak_kb, s_h.peak_kb)
    r["rss_mb"] = s.peak_kb / 1024 if s.daemon else None
    return r


def random_preads(path, size, n):
    rnd = random.Random(42)
    fd = os.open(path, os.O_RDONLY)
    lat = []
    start = time.monotonic()
    try:
        for _ in range(n):
            if time.monotonic() - start > LIMIT:
                break
            off = rnd.randrange(0, max(1, size - 4096)) & ~4095
            t0 = time.monotonic()
            os.pread(fd, 4096, off)
            lat.append(time.monotonic() - t0)
    finally:
        os.close(fd)
    out = percentiles(lat)
    out["n"] = len(lat)
    return out


def small_file_sample():
    files = []
    for d, _, names in os.walk(SRC):
        for n in names:
            p = os.path.join(d, n)
            if not os.path.islink(p) and os.path.getsize(p) < 16384:
                files.append(os.path.relpath(p, SRC))
    files.sort()
    return random.Random(7).sample(files, 2000)


def largest_file():
    best = (0, None)
    for d, _, names in os.walk(SRC):
        for n in names:
            p = os.path.join(d, n)
            if not os.path.islink(p):
                best = max(best, (os.path.getsize(p), p))
    return os.path.relpath(best[1], SRC)


def prepare_huge():
    """A 1 GiB file of kernel text, as one member of each system's format."""
    hd = os.path.join(WORK, "huge")
    src = os.path.join(hd, "src")
    if os.path.exists(os.path.join(hd, "done")):
        if not os.path.exists(os.path.join(hd, "targz", "huge.tar.gz")):
            os.makedirs(os.path.join(hd, "targz"), exist_ok=True)
            sh(f"tar -C '{src}' -cf - huge.txt | gzip -6 > '{hd}/targz/huge.tar.gz'")
        return hd
    os.makedirs(src, exist_ok=True)
    target = 1 << 30
    with open(os.path.join(src, "huge.txt"), "wb") as out:
        n = 0
        for d, _, names in sorted(os.walk(os.path.join(SRC, "drivers"))):
            for name in sorted(names):
                p = os.path.join(d, name)
                if name.endswith((".c", ".h")) and not os.path.islink(p):
                    data = open(p, "rb").read()[: target - n]
                    out.write(data)
                    n += len(data)
                if n >= target:
                    break
            if n >= target:
                break
        while n < target:  # not enough text: repeat what there is
            out.flush()
            chunk = open(os.path.join(src, "huge.txt"), "rb").read(min(target - n, 1 << 26))
            out.write(chunk)
            n += len(chunk)
    log("huge: zip, pack, squashfs, tar.gz")
    sh(f"cd '{src}' && zip -q -6 '{hd}/huge.zip' huge.txt")
    os.makedirs(os.path.join(hd, "targz"), exist_ok=True)
    sh(f"tar -C '{src}' -cf - huge.txt | gzip -6 > '{hd}/targz/huge.tar.gz'")
    os.makedirs(os.path.join(hd, "zip"), exist_ok=True)
    os.makedirs(os.path.join(hd, "zst"), exist_ok=True)
    shutil.copy(os.path.join(hd, "huge.zip"), os.path.join(hd, "zip", "huge.zip"))
    sh(f"'{PKGFS}' pack '{src}' -o '{hd}/zst/huge.tar.zst'")
    sh(f"mksquashfs '{src}' '{hd}/huge.sqfs' -comp zstd -quiet -no-progress")
    open(os.path.join(hd, "done"), "w").close()
    return hd


# Where pkgfs keeps the indexes of the tar.gz packages during a run: emptied before the
# system's first mount, so that mount's time includes the index pass ("mount_first")
# and every later mount reads the cache.
TARGZ_INDEX = os.path.join(WORK, "targz-index")


def systems():
    zipdir, zstdir = os.path.join(WORK, "pkgs-zip-all"), os.path.join(WORK, "pkgs-zst-all")
    tgzdir = os.path.join(WORK, "pkgs-targz-all")
    nzip, nzst = len(os.listdir(zipdir)), len(os.listdir(zstdir))
    ntgz = len(os.listdir(tgzdir)) if os.path.isdir(tgzdir) else 0
    sqfs, onezip = os.path.join(WORK, "linux.sqfs"), os.path.join(WORK, "linux.zip")
    zips = " ".join(f"'{os.path.join(zipdir, z)}'" for z in sorted(os.listdir(zipdir)))
    hd = os.path.join(WORK, "huge")
    rat = os.path.join(VENV, "ratarmount")
    S = System
    return [
        (S("pkgfs-zip", f"pkgfs ({nzip} zip -6 packages)",
           f"'{PKGFS}' mount '{zipdir}' '{MNT}'", f"pkgfs mount {zipdir}"),
         S("pkgfs-zip", "", f"'{PKGFS}' mount '{hd}/zip' '{MNT}'", f"pkgfs mount {hd}/zip")),
        (S("pkgfs-zst", f"pkgfs ({nzst} pkgfs packages)",
           f"'{PKGFS}' mount '{zstdir}' '{MNT}'", f"pkgfs mount {zstdir}"),
         S("pkgfs-zst", "", f"'{PKGFS}' mount '{hd}/zst' '{MNT}'", f"pkgfs mount {hd}/zst")),
        (S("pkgfs-targz", f"pkgfs ({ntgz} tar.gz packages)",
           f"'{PKGFS}' mount --index-cache '{TARGZ_INDEX}' '{tgzdir}' '{MNT}'",
           f"pkgfs mount --index-cache {TARGZ_INDEX}"),
         S("pkgfs-targz", "", f"'{PKGFS}' mount --index-cache '{TARGZ_INDEX}' '{hd}/targz' '{MNT}'",
           f"pkgfs mount --index-cache {TARGZ_INDEX}")),
        (S("squashfuse_ll", "squashfuse_ll (zstd image)",
           f"squashfuse_ll '{sqfs}' '{MNT}'", f"squashfuse_ll {sqfs}"),
         S("squashfuse_ll", "", f"squashfuse_ll '{hd}/huge.sqfs' '{MNT}'",
           f"squashfuse_ll {hd}/huge.sqfs")),
        (S("kernel-squashfs", "kernel squashfs (loop, zstd image)",
           f"mount -t squashfs -o loop,ro '{sqfs}' '{MNT}'"),
         S("kernel-squashfs", "", f"mount -t squashfs -o loop,ro '{hd}/huge.sqfs' '{MNT}'")),
        (S("fuse-zip", "fuse-zip (one zip -6)", f"fuse-zip -r '{onezip}' '{MNT}'",
           f"fuse-zip -r {onezip}"),
         S("fuse-zip", "", f"fuse-zip -r '{hd}/huge.zip' '{MNT}'", f"fuse-zip -r {hd}/huge.zip")),
        (S("ratarmount", f"ratarmount (union of the {nzip} zips)",
           f"'{rat}' --index-folders '{WORK}/ratarmount-index' {zips} '{MNT}'",
           f"ratarmount --index-folders"),
         S("ratarmount", "", f"'{rat}' --index-folders '{WORK}/ratarmount-index' '{hd}/huge.zip' '{MNT}'",
           "ratarmount --index-folders")),
        # One tarball: ratarmount's union of the 609 tar.gz cannot start here (its
        # daemonising fork fails with ENOMEM once it holds 609 gzip readers).
        (S("ratarmount-targz", "ratarmount (one tar.gz)",
           f"'{rat}' --index-folders '{WORK}/ratarmount-index-targz' '{WORK}/linux.tar.gz' '{MNT}'",
           "ratarmount --index-folders"),
         S("ratarmount-targz", "", f"'{rat}' --index-folders '{WORK}/ratarmount-index-targz' '{hd}/targz/huge.tar.gz' '{MNT}'",
           "ratarmount --index-folders")),
        (S("archivemount", "archivemount (one zip -6)",
           f"archivemount -o readonly '{onezip}' '{MNT}'", f"archivemount -o readonly {onezip}"),
         S("archivemount", "", f"archivemount -o readonly '{hd}/huge.zip' '{MNT}'",
           f"archivemount -o readonly {hd}/huge.zip")),
        (S("extracted", "extracted tree (ext4, bind mount)", f"mount --bind '{SRC}' '{MNT}'"),
         S("extracted", "", f"mount --bind '{hd}/src' '{MNT}'")),
    ]


def gen_scale(n):
    d = os.path.join(WORK, "scale", str(n))
    if os.path.exists(d + ".done"):
        return d
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for i in range(n):
        with zipfile.ZipFile(os.path.join(d, f"pkg{i:05}.zip"), "w", zipfile.ZIP_STORED) as z:
            for j in range(100):
                z.writestr(f"pkg{i:05}/mod{j // 10}/file{j}.py", b"x = %d\n" % j)
    open(d + ".done", "w").close()
    return d


def scaling():
    out = []
    for n in ([1000, 2000] if QUICK else [1000, 2000, 5000, 10000]):
        d = gen_scale(n)
        runs = []
        for _ in range(3):
            unmount()
            drop_caches()
            t0 = time.monotonic()
            sh(f"'{PKGFS}' mount '{d}' '{MNT}'")
            t = time.monotonic() - t0
            rss = hwm_kb(f"pkgfs mount {d}") / 1024
            runs.append((t, rss))
            unmount()
        t, rss = min(runs)
        out.append({"packages": n, "entries": n * 100, "mount_s": t, "rss_mb": rss,
                    "runs_s": [r[0] for r in runs]})
        log(f"scaling {n}: {t:.2f} s, {rss:.0f} MB")
    return out


# pkgfs takes requests through FUSE over io_uring when the kernel offers it; the kernel
# offers it only with the fuse module's enable_uring on (off by default). The benchmark
# switches it on for its run (and back after) unless --dev-fuse is given, which measures
# pkgfs over /dev/fuse. Each pkgfs result records the transport its status reported.
ENABLE_URING = "/sys/module/fuse/parameters/enable_uring"
DEV_FUSE = "--dev-fuse" in ARGS


def transport():
    """The transport the pkgfs mount at MNT reports."""
    out = subprocess.run([PKGFS, "status", "--json", MNT], capture_output=True, text=True)
    try:
        return json.loads(out.stdout).get("transport", "?")
    except ValueError:
        return "?"


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    mem = next(l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal"))
    return {"cpu": cpu, "cores": os.cpu_count(), "mem_gb": round(int(mem) / 2**20, 1),
            "kernel": os.uname().release, "date": time.strftime("%Y-%m-%d"),
            "pkgfs": subprocess.run([PKGFS, "--version"], capture_output=True,
                                    text=True).stdout.strip()}


def main():
    before = None
    if os.path.exists(ENABLE_URING):
        with open(ENABLE_URING) as f:
            before = f.read().strip()
        with open(ENABLE_URING, "w") as f:
            f.write("N" if DEV_FUSE else "Y")
    try:
        measure()
    finally:
        if before is not None:
            with open(ENABLE_URING, "w") as f:
                f.write(before)


def measure():
    os.makedirs(MNT, exist_ok=True)
    prepare_huge()
    small = small_file_sample()
    large = largest_file()
    results = {"machine": machine(), "corpus": {"files": sum(len(f) for _, _, f in os.walk(SRC)),
               "large_file": large, "large_size": os.path.getsize(os.path.join(SRC, large)),
               "small_sample": len(small)}, "systems": {}}
    if MERGE and os.path.exists(OUT):
        with open(OUT) as f:
            old = json.load(f)
        results["systems"] = old.get("systems", {})
        if "scaling" in old:
            results["scaling"] = old["scaling"]
    measured = []
    for main_s, huge_s in systems():
        if ONLY and main_s.key not in ONLY:
            continue
        measured.append(main_s)
        log(f"== {main_s.name}")
        try:
            r = run_workloads(main_s, small, large, (huge_s, "huge.txt"))
        except Exception as e:  # a peer that fails or times out is reported, not fatal
            log(f"{main_s.key}: {e}")
            unmount()
            r = {"error": str(e)[:300]}
        r["name"] = main_s.name
        r["measured"] = time.strftime("%Y-%m-%d %H:%M")
        r["run"] = RUN
        results["systems"][main_s.key] = r
        log(json.dumps(r))
        with open(OUT, "w") as f:
            json.dump(results, f, indent=1)
    cold_rounds(measured, results)
    with open(OUT, "w") as f:
        json.dump(results, f, indent=1)
    if "--skip-scaling" not in ARGS:
        results["scaling"] = scaling()
    with open(OUT, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
