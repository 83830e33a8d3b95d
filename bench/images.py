#!/usr/bin/env python3
"""The container-image targets (issue "container images"), in one run:

    images.py WORKDIR OUT.json [--rounds N]

On the image bench/images.sh builds (Debian bookworm with python3, two gzip layers;
and its zstd:chunked copy), in N alternating rounds (default 5), the page cache dropped
before each system, the time from "I have an image" to the first output of
`python3 -c 'import json; print("ok")'` run in it, and the bytes of layer blobs read:

  umoci-unpack       `umoci unpack` into a directory, then chroot into its rootfs
  tar-unpack         `tar -xzf` of each layer in order (a lower bound on unpacking: no
                     whiteouts, no xattrs, nothing checked), then chroot
  pkgfs-gzip-first   `pkgfs mount oci:…` with an empty index cache (the index pass reads
                     and checks every layer), then chroot into the mount
  pkgfs-gzip-cached  the same with the indexes cached by an earlier mount
  pkgfs-zstd-chunked the zstd:chunked copy: the tables of contents, then the chunks read

Bytes read: the unpackers read every blob; for pkgfs, the daemon's `rchar` from
/proc/PID/io when the command has printed (everything it read: layers, tables, the
index cache). Then `pkgfs mount` alone, cold, N times: cached gzip and zstd:chunked
(the target: under 0.3 s). Results to OUT.json, a summary to standard output.
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import time

WORK = sys.argv[1]
OUT = sys.argv[2]
ARGS = sys.argv[3:]
ROUNDS = int(ARGS[ARGS.index("--rounds") + 1]) if "--rounds" in ARGS else 5
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKGFS = os.path.join(HERE, "target/release/pkgfs")
IMAGES = os.path.join(WORK, "images")
GZ = os.path.join(IMAGES, "oci-gzip")
ZC = os.path.join(IMAGES, "oci-zstd-chunked")
SCRATCH = os.path.join(WORK, "images-run")
MNT = os.path.join(SCRATCH, "mnt")
CMD = ["/usr/bin/python3", "-c", "import json; print('ok')"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sh(cmd):
    subprocess.run(["bash", "-c", cmd], check=True, stdout=subprocess.DEVNULL)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def layers(layout):
    idx = json.load(open(os.path.join(layout, "index.json")))
    man = json.load(open(os.path.join(layout, "blobs/sha256", idx["manifests"][0]["digest"][7:])))
    return [os.path.join(layout, "blobs/sha256", l["digest"][7:]) for l in man["layers"]]


def blob_bytes(layout):
    return sum(os.path.getsize(p) for p in layers(layout))


def run_in(root):
    out = subprocess.run(["/usr/sbin/chroot", root] + CMD, check=True, capture_output=True, env={"PATH": "/usr/bin:/bin"})
    assert out.stdout == b"ok\n", out


def unmount():
    subprocess.run(["umount", MNT], stderr=subprocess.DEVNULL)


def daemon_rchar():
    st = json.loads(subprocess.run([PKGFS, "status", "--json", MNT], check=True,
                                   capture_output=True).stdout)
    for line in open(f"/proc/{st['pid']}/io"):
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def umoci_unpack():
    d = os.path.join(SCRATCH, "umoci")
    shutil.rmtree(d, ignore_errors=True)
    t0 = time.monotonic()
    sh(f"umoci unpack --image '{GZ}:latest' '{d}'")
    run_in(os.path.join(d, "rootfs"))
    t = time.monotonic() - t0
    shutil.rmtree(d)
    return t, blob_bytes(GZ)


def tar_unpack():
    d = os.path.join(SCRATCH, "tar")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    t0 = time.monotonic()
    for blob in layers(GZ):
        sh(f"tar -xzf '{blob}' -C '{d}' --numeric-owner")
    run_in(d)
    t = time.monotonic() - t0
    shutil.rmtree(d)
    return t, blob_bytes(GZ)


def pkgfs(layout, cache, fresh):
    if fresh:
        shutil.rmtree(cache, ignore_errors=True)
    t0 = time.monotonic()
    sh(f"'{PKGFS}' mount -q --index-cache '{cache}' 'oci:{layout}' '{MNT}'")
    run_in(MNT)
    t = time.monotonic() - t0
    read = daemon_rchar()
    unmount()
    return t, read


def mount_only(layout, cache):
    drop_caches()
    t0 = time.monotonic()
    sh(f"'{PKGFS}' mount -q --index-cache '{cache}' 'oci:{layout}' '{MNT}'")
    t = time.monotonic() - t0
    unmount()
    return t


def main():
    sh(f"bash '{HERE}/bench/images.sh' '{WORK}'")
    shutil.rmtree(SCRATCH, ignore_errors=True)
    os.makedirs(MNT)
    cache_gz, cache_zc = os.path.join(SCRATCH, "cache-gz"), os.path.join(SCRATCH, "cache-zc")
    systems = {
        "umoci-unpack": umoci_unpack,
        "tar-unpack": tar_unpack,
        "pkgfs-gzip-first": lambda: pkgfs(GZ, cache_gz, True),
        "pkgfs-gzip-cached": lambda: pkgfs(GZ, cache_gz, False),
        "pkgfs-zstd-chunked": lambda: pkgfs(ZC, cache_zc, True),
    }
    r = {"rounds": ROUNDS, "measured": time.strftime("%Y-%m-%d %H:%M"),
         "blob_bytes": {"gzip": blob_bytes(GZ), "zstd:chunked": blob_bytes(ZC)},
         "first_output_s": {k: [] for k in systems}, "bytes_read": {k: [] for k in systems}}
    for i in range(ROUNDS):
        for name, f in systems.items():
            drop_caches()
            t, b = f()
            r["first_output_s"][name].append(t)
            r["bytes_read"][name].append(b)
        log(f"round {i + 1}:", {k: round(v[-1], 3) for k, v in r["first_output_s"].items()})
    r["median_s"] = {k: statistics.median(v) for k, v in r["first_output_s"].items()}
    r["mount_only_s"] = {"gzip-cached": [mount_only(GZ, cache_gz) for _ in range(ROUNDS)],
                         "zstd-chunked": [mount_only(ZC, cache_zc) for _ in range(ROUNDS)]}
    shutil.rmtree(SCRATCH, ignore_errors=True)
    with open(OUT, "w") as f:
        json.dump(r, f, indent=1)
    m, total = r["median_s"], r["blob_bytes"]
    print(f"image: {total['gzip'] >> 20} MiB of gzip layers, {total['zstd:chunked'] >> 20} MiB as zstd:chunked")
    for k in systems:
        share = statistics.median(r["bytes_read"][k]) / (total["zstd:chunked"] if "chunked" in k else total["gzip"])
        print(f"  {k:20} first output in {m[k]:.3f} s (rounds: "
              f"{', '.join(f'{x:.3f}' for x in r['first_output_s'][k])}); {100 * share:.1f} % of the blobs read")
    for k in ("pkgfs-gzip-first", "pkgfs-gzip-cached", "pkgfs-zstd-chunked"):
        ratios = [u / p for u, p in zip(r["first_output_s"]["umoci-unpack"], r["first_output_s"][k])]
        print(f"  umoci-unpack / {k}: {', '.join(f'{x:.1f}' for x in ratios)}")
    for k, v in r["mount_only_s"].items():
        print(f"  mount only, cold, {k}: median {statistics.median(v):.3f} s ({', '.join(f'{x:.3f}' for x in v)})")


if __name__ == "__main__":
    main()
