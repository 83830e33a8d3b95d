#!/usr/bin/env python3
"""The registry targets (issue 30, images straight from registries), in one run:

    registry.py WORKDIR OUT.json [--rounds N] [--delay-ms MS] [--mbit RATE]

The Debian+python3 image of bench/images.sh (two gzip layers), pushed by skopeo to a
registry on loopback (Debian's docker-registry, distribution 2.8) as it is (gzip), as
zstd:chunked (skopeo --dest-compress-format), and as a SOCI-enabled image (AWS's soci
convert, 4 MiB spans, zTOCs for both layers), behind examples/delayproxy adding MS ms
(default 20) to every chunk each way: a request and its answer cost 2 x MS more, as
`tc netem delay` would; with --mbit, one link of RATE Mbit/s each way too (default: no
limit). Each step drops the page cache first. In N rotating rounds
(default 3), the time from nothing to the first output of
`python3 -c 'import json; print("ok")'` run in the image, and the layer bytes the
registry sent (counted by the proxy):

  skopeo+umoci          `skopeo copy docker://… oci:DIR` then `umoci unpack`, chroot
  podman                `podman pull` (its own storage emptied first) then
                        `podman image mount` and chroot (podman's run fails on this
                        machine setting rlimits without CAP_SYS_RESOURCE)
  podman+store-FORMAT   `podman pull` taking its layers from `pkgfs store` (started
                        before, with an empty disk cache), then `podman image mount`
                        and chroot
  pkgfs-FORMAT-cold     `pkgfs mount docker://…` with an empty disk and index cache, chroot
                        (layers read lazily are fetched whole in the background, the
                        default)
  pkgfs-FORMAT-lazy     the same with --no-background-fetch: only what is read is fetched
                        (zstd-chunked and soci)
  pkgfs-FORMAT-warm     the same after an unmount, on the caches the cold mount filled
  pkgfs-FORMAT-pinned   warm, the image named by its manifest's digest (no request at all)
  local-FORMAT          `pkgfs mount oci:LAYOUT` of the same image on local disk, its
                        index cache warm (what "within 1.2x of a local layout" compares to)

FORMAT is gzip (the index pass streams each layer), zstd-chunked (table of contents, then
chunks) and soci (zTOC, then spans). Results to OUT.json, a summary to standard output.
Needs root; installs docker-registry, skopeo, umoci and podman; builds soci through
mount-tests/registry/make_soci.sh.
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
ROUNDS = int(ARGS[ARGS.index("--rounds") + 1]) if "--rounds" in ARGS else 3
DELAY = int(ARGS[ARGS.index("--delay-ms") + 1]) if "--delay-ms" in ARGS else 20
MBIT = int(ARGS[ARGS.index("--mbit") + 1]) if "--mbit" in ARGS else 0
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKGFS = os.path.join(HERE, "target/release/pkgfs")
DELAYPROXY = os.path.join(HERE, "target/release/examples/delayproxy")
IMAGES = os.path.join(WORK, "images")
GZ = os.path.join(IMAGES, "oci-gzip")
ZC = os.path.join(IMAGES, "oci-zstd-chunked")
SOCI = os.path.join(IMAGES, "oci-gzip-soci")
SCRATCH = os.path.join(WORK, "registry-run")
MNT = os.path.join(SCRATCH, "mnt")
CMD = ["/usr/bin/python3", "-c", "import json; print('ok')"]
PROCS = []


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sh(cmd, quiet=True):
    subprocess.run(["bash", "-c", cmd], check=True,
                   stdout=subprocess.DEVNULL if quiet else None)


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


free_port = common.free_port
wait_listening = common.wait_listening


def spawn(cmd, **kw):
    kw.setdefault("stderr", subprocess.DEVNULL)
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, **kw)
    PROCS.append(p)
    return p


def run_in(root):
    out = subprocess.run(["/usr/sbin/chroot", root] + CMD, check=True, capture_output=True,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.stdout == b"ok\n", out


def unmount(path=MNT):
    subprocess.run(["umount", path], stderr=subprocess.DEVNULL)


def layer_bytes(layout):
    idx = json.load(open(os.path.join(layout, "index.json")))
    man = json.load(open(os.path.join(layout, "blobs/sha256", idx["manifests"][0]["digest"][7:])))
    if "manifests" in man:  # an index (the SOCI-enabled image): its image
        man = json.load(open(os.path.join(layout, "blobs/sha256", man["manifests"][0]["digest"][7:])))
    return sum(l["size"] for l in man["layers"])


class Proxy:
    """examples/delayproxy in front of the registry; its stats file counts bytes."""

    def __init__(self, upstream, scratch=None, delay=None, extra=()):
        self.stats = os.path.join(scratch or SCRATCH, "proxy.stats")
        self.port = free_port()
        spawn([DELAYPROXY, str(self.port), str(upstream), str(delay or DELAY), self.stats,
               *extra])
        wait_listening(self.port, "delayproxy")

    def counters(self):
        time.sleep(0.12)  # the proxy rewrites its stats every 50 ms
        try:
            with open(self.stats) as f:
                return [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            return [0, 0, 0]

    def sent_since(self, mark):
        return self.counters()[2] - mark[2]


def ensure_images():
    sh(f"bash '{HERE}/bench/images.sh' '{WORK}'")
    if not os.path.isdir(SOCI):
        soci = os.path.join(HERE, "target/soci-fixtures/bin/soci")
        if not os.path.exists(soci):
            sh(f"bash '{HERE}/mount-tests/images/make_images.sh'")
            sh(f"bash '{HERE}/mount-tests/registry/make_soci.sh'")
        sh(f"'{soci}' convert --standalone --format oci-dir --min-layer-size 0 '{GZ}' '{SOCI}'")
        shutil.rmtree(os.path.join(SOCI, "ingest"), ignore_errors=True)


def start_registry(scratch=None):
    d = os.path.join(scratch or SCRATCH, "registry")
    os.makedirs(d)
    port = free_port()
    with open(os.path.join(d, "config.yml"), "w") as f:
        f.write(f"version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
                f"storage:\n  filesystem:\n    rootdirectory: {d}/data\n"
                f"http:\n  addr: 127.0.0.1:{port}\n")
    spawn(["docker-registry", "serve", os.path.join(d, "config.yml")])
    wait_listening(port, "docker-registry")
    return port


def main():
    for tool, pkg in [("docker-registry", "docker-registry"), ("skopeo", "skopeo"),
                      ("umoci", "umoci"), ("podman", "podman")]:
        if shutil.which(tool) is None:
            sh(f"apt-get install -y -qq {pkg}")
    ensure_images()
    unmount()
    shutil.rmtree(SCRATCH, ignore_errors=True)
    os.makedirs(MNT)
    port = start_registry()
    direct = f"127.0.0.1:{port}"
    for name, layout, all_ in [("gzip", GZ, False), ("zstd-chunked", ZC, False), ("soci", SOCI, True)]:
        sh(f"skopeo copy --quiet {'--all' if all_ else ''} --dest-tls-verify=false "
           f"oci:{layout} docker://{direct}/bench/{name}:1")
    proxy = Proxy(port, extra=("--mbit", str(MBIT)) if MBIT else ())
    last_requests = [0]  # the last pkgfs mount's requests by its first output
    via = f"127.0.0.1:{proxy.port}"
    caches = {f: os.path.join(SCRATCH, f"cache-{f}") for f in ("gzip", "zstd-chunked", "soci")}
    local_cache = os.path.join(SCRATCH, "cache-local")
    layouts = {"gzip": GZ, "zstd-chunked": ZC, "soci": SOCI}

    digests = {}
    for f in caches:
        raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false",
                              f"docker://{direct}/bench/{f}:1"], check=True, capture_output=True).stdout
        import hashlib
        digests[f] = "sha256:" + hashlib.sha256(raw).hexdigest()

    def pkgfs_remote(fmt, cold, extra="", pinned=False):
        c = caches[fmt] + ("-lazy" if extra else "")
        if cold:
            common.retire(c)
        ref = f"bench/{fmt}@{digests[fmt]}" if pinned else f"bench/{fmt}:1"
        t0 = time.monotonic()
        sh(f"'{PKGFS}' mount -q --tls-verify=false --io-uring off --disk-cache '{c}/disk' "
           f"--index-cache '{c}/index' {extra} docker://{via}/{ref} '{MNT}'")
        run_in(MNT)
        t = time.monotonic() - t0
        st = json.loads(subprocess.run([PKGFS, "status", "--json", MNT], check=True,
                                       capture_output=True, text=True).stdout)["remote"]
        last_requests[0] = st["requests"]
        unmount()
        return t

    def local(fmt):
        t0 = time.monotonic()
        sh(f"'{PKGFS}' mount -q --io-uring off --index-cache '{local_cache}' "
           f"'oci:{layouts[fmt]}' '{MNT}'")
        run_in(MNT)
        t = time.monotonic() - t0
        unmount()
        return t

    def skopeo_umoci():
        d = os.path.join(SCRATCH, "copy")
        b = os.path.join(SCRATCH, "bundle")
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(b, ignore_errors=True)
        t0 = time.monotonic()
        sh(f"skopeo copy --quiet --src-tls-verify=false docker://{via}/bench/gzip:1 oci:{d}:latest")
        sh(f"umoci unpack --image '{d}:latest' '{b}'")
        run_in(os.path.join(b, "rootfs"))
        t = time.monotonic() - t0
        shutil.rmtree(d)
        shutil.rmtree(b)
        return t

    def podman():
        sh("podman rmi -a -f >/dev/null 2>&1 || true")
        t0 = time.monotonic()
        sh(f"podman pull -q --tls-verify=false {via}/bench/gzip:1")
        root = subprocess.run(["podman", "image", "mount", f"{via}/bench/gzip:1"], check=True,
                              capture_output=True, text=True).stdout.strip()
        run_in(root)
        t = time.monotonic() - t0
        sh(f"podman image unmount {via}/bench/gzip:1 >/dev/null 2>&1 || true")
        return t

    store_mp = os.path.join(SCRATCH, "store")
    os.makedirs(store_mp, exist_ok=True)
    pod = (f"podman --root '{SCRATCH}/podman-root' --runroot '{SCRATCH}/podman-run' "
           f"--storage-driver overlay --events-backend none "
           f"--storage-opt overlay.additionallayerstore={store_mp}:ref")

    def podman_store(fmt):
        # The store is a service started before the pull (cold: an empty disk cache).
        sh(f"{pod} image unmount -a >/dev/null 2>&1 || true")
        sh(f"{pod} rmi -a -f >/dev/null 2>&1 || true")
        unmount(store_mp)
        c = os.path.join(SCRATCH, "cache-store")
        common.retire(c)
        sh(f"'{PKGFS}' store -q --tls-verify=false --io-uring off --disk-cache '{c}/disk' "
           f"--index-cache '{c}/index' '{store_mp}'")
        drop_caches()
        t0 = time.monotonic()
        sh(f"{pod} pull -q --tls-verify=false {via}/bench/{fmt}:1")
        root = subprocess.run(f"{pod} image mount {via}/bench/{fmt}:1", shell=True, check=True,
                              capture_output=True, text=True).stdout.strip()
        run_in(root)
        t = time.monotonic() - t0
        sh(f"{pod} image unmount -a >/dev/null 2>&1 || true")
        return t

    # Warm the local index caches once (local-FORMAT is "a mount of a layout on disk").
    for f in layouts:
        local(f)
    systems = {"skopeo+umoci": skopeo_umoci, "podman": podman,
               "podman+store-gzip": lambda: podman_store("gzip"),
               "podman+store-zstd-chunked": lambda: podman_store("zstd-chunked")}
    for f in ("gzip", "zstd-chunked", "soci"):
        systems[f"pkgfs-{f}-cold"] = (lambda f=f: pkgfs_remote(f, True))
        if f != "gzip":
            systems[f"pkgfs-{f}-lazy"] = (lambda f=f: pkgfs_remote(f, True, "--no-background-fetch"))
        systems[f"pkgfs-{f}-warm"] = (lambda f=f: pkgfs_remote(f, False))
        systems[f"pkgfs-{f}-pinned"] = (lambda f=f: pkgfs_remote(f, False, pinned=True))
        systems[f"local-{f}"] = (lambda f=f: local(f))
    r = {"rounds": ROUNDS, "delay_ms": DELAY, "mbit": MBIT,
         "measured": time.strftime("%Y-%m-%d %H:%M"),
         "build": subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True).stdout.strip(),
         "layer_bytes": {f: layer_bytes(l) for f, l in layouts.items()},
         "first_output_s": {k: [] for k in systems}, "sent_bytes": {k: [] for k in systems}}
    for i in range(ROUNDS):
        for name, fn in systems.items():
            drop_caches()
            mark = proxy.counters()
            try:
                t = fn()
            except subprocess.CalledProcessError as e:
                log(f"{name}: failed ({e}); left out of this round")
                continue
            r["first_output_s"][name].append(t)
            r["sent_bytes"][name].append(proxy.sent_since(mark))
            if name.startswith("pkgfs-"):
                r.setdefault("requests", {}).setdefault(name, []).append(last_requests[0])
        log(f"round {i + 1}:", {k: round(v[-1], 3) for k, v in r["first_output_s"].items() if v})
    r["median_s"] = {k: statistics.median(v) for k, v in r["first_output_s"].items() if v}
    with open(OUT, "w") as f:
        json.dump(r, f, indent=1)
    m = r["median_s"]
    print(f"{DELAY} ms each way; layers: " + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in r["layer_bytes"].items()))
    base = m.get("skopeo+umoci")
    for k, v in m.items():
        fmt = next((f for f in layouts if f in k), "gzip")
        sent = statistics.median(r["sent_bytes"][k]) / r["layer_bytes"][fmt]
        vs = (f", {base / v:.1f}x sooner than skopeo+umoci"
              if base and (k.startswith("pkgfs") or "store" in k) else "")
        print(f"  {k:24} {v:.3f} s ({', '.join(f'{x:.3f}' for x in r['first_output_s'][k])}); "
              f"sent {100 * sent:.1f} % of the layers{vs}")
    rtt = 2 * DELAY / 1000
    for f in layouts:
        for w in ("cold", "lazy", "warm", "pinned"):
            k = f"pkgfs-{f}-{w}"
            if k in m and f"local-{f}" in m:
                # Beyond the local mount and (cold) the bytes' time on the link: round
                # trips. A warm mount's bytes are not on its path (what the cold one's
                # background fetch left to fetch), so they are not taken off.
                wire = (statistics.median(r["sent_bytes"][k]) * 8 / (MBIT * 1e6)
                        if MBIT and w in ("cold", "lazy") else 0)
                over = (m[k] - m[f"local-{f}"] - wire) / rtt
                print(f"  {w} / local, {f}: {m[k] / m[f'local-{f}']:.2f}x; "
                      f"{statistics.median(r['requests'][k]):.0f} requests, "
                      f"{over:.1f} round trips beyond local + {wire:.2f} s of transfer")


if __name__ == "__main__":
    try:
        main()
    finally:
        unmount()
        unmount(os.path.join(SCRATCH, "store"))
        for p in PROCS:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
