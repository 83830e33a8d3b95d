#!/usr/bin/env python3
"""containerd pulling through `pkgfs snapshotter` (issue 40), on a node's network:

    snapshotter.py WORKDIR OUT.json [--rounds N] [--delay-ms MS] [--mbit RATE] [--only A,B]

The Debian+python3 image of bench/images.sh (two gzip layers, 200 MB unpacked) in a
registry on loopback (Debian's docker-registry) as gzip, zstd:chunked, a SOCI-enabled
image (AWS's `soci convert`) and eStargz (`ctr-remote images convert`), behind
examples/delayproxy: MS ms each way (default 20: a 40 ms round trip) and one link of
RATE Mbit/s each way (default 100). A private containerd 1.6 (tasks on, pkgfs as a proxy
snapshot plugin) runs each system; each step drops the page cache and starts from
nothing (the image removed, `ctr images rm --sync`, the store's caches emptied). In N
rotating rounds (default 3), the time from the pull's start to the first output of
`python3 -c 'import json; print("ok")'` in the container (`ctr run --rm`), and the bytes
the registry sent through the proxy:

  overlayfs              `ctr images pull` into containerd's overlayfs snapshotter
                         (download, unpack), then `ctr run`
  pkgfs-FORMAT           `ctr-remote images rpull --snapshotter pkgfs` (layers from a
                         `pkgfs store` with empty caches, fetched whole in the background
                         as it does by default), then `ctr run`
  pkgfs-FORMAT-again     the same, right after pkgfs-FORMAT, with what that run left on
                         the node kept (the record of its start, `--start-window 5s`, and
                         the note that the registry speaks plain HTTP; every other cache
                         emptied): what the image's earlier start read is fetched ahead
  pkgfs-FORMAT-lazy      the same as pkgfs-FORMAT, the store with --no-background-fetch
                         (only what is read is fetched)
  stargz                 stargz-snapshotter v0.19.1 (its defaults: prefetch of the
                         prioritized files, background fetch) on the eStargz image,
                         `ctr-remote images rpull --snapshotter stargz`
  soci                   the SOCI snapshotter v0.16.1 (its defaults: background fetch) on
                         the SOCI-enabled image, pulled by soci-rpull (the CRI labels it
                         needs, as nerdctl sends them)

FORMAT: gzip (the store's index pass reads each layer whole), zstd-chunked, soci, estargz,
estargz-opt (eStargz with the files python's start reads first prioritized, by
`ctr-remote images optimize`; stargz-opt is stargz-snapshotter on it).
The peers are built from the Go module proxy by bench/peers/build_snapshotters.sh (its
header says how, and what was patched for Debian's containerd); each run starts them on an
empty root. Results to OUT.json, a summary to standard output. Needs root, containerd,
ctr-remote, docker-registry, skopeo, Go; builds what bench/registry.py builds.
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
import registry as reg  # noqa: E402  (same WORKDIR OUT.json arguments)

WORK = sys.argv[1]
OUT = sys.argv[2]
ARGS = sys.argv[3:]
ROUNDS = common.arg(ARGS, "--rounds", 3)
DELAY = common.arg(ARGS, "--delay-ms", 20)
MBIT = common.arg(ARGS, "--mbit", 100)
HERE = reg.HERE
PKGFS = reg.PKGFS
SCRATCH = os.path.join(WORK, "snapshotter-run")
CMD = ["python3", "-c", "import json; print('ok')"]
# How long the store records a start (`--start-window`): python's is over in a second.
START_WINDOW_S = 5
START_WINDOW = f"{START_WINDOW_S}s"
log = common.log


class Containerd:
    """A private containerd with tasks and pkgfs as the proxy plugin `pkgfs`."""

    def __init__(self, d):
        self.d = d
        os.makedirs(os.path.join(d, "tmp"), exist_ok=True)
        with open(os.path.join(d, "config.toml"), "w") as f:
            f.write(f"""version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.internal.v1.opt",
  "io.containerd.internal.v1.restart", "io.containerd.internal.v1.tracing",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "{d}/c.sock"
[ttrpc]
  address = "{d}/c.sock.ttrpc"
[proxy_plugins.pkgfs]
  type = "snapshot"
  address = "{d}/s.sock"
[proxy_plugins.stargz]
  type = "snapshot"
  address = "{d}/stargz.sock"
[proxy_plugins.soci]
  type = "snapshot"
  address = "{d}/soci.sock"
""")
        self.proc = None
        self.start()

    def start(self):
        d = self.d
        self.proc = reg.spawn(["containerd", "--config", os.path.join(d, "config.toml")],
                              env=dict(os.environ, TMPDIR=os.path.join(d, "tmp")))
        self.wait_socket(os.path.join(d, "c.sock"), "containerd")

    def restart(self):
        """Stopped and started again: it dials its proxy plugins afresh (a plugin that
        was down when last dialled is otherwise retried only after a back-off)."""
        self.proc.terminate()
        self.proc.wait(30)
        self.start()

    @staticmethod
    def wait_socket(path, what):
        import socket
        for _ in range(600):
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(path)
                s.close()
                return
            except OSError:
                time.sleep(0.05)
        raise SystemExit(f"{what} does not answer on {path}")

    def ctr(self, *args, tool="ctr", ns="bench"):
        return [tool, "-a", os.path.join(self.d, "c.sock"), "-n", ns, *args]

    def run(self, *args, **kw):
        r = subprocess.run(self.ctr(*args, **kw), capture_output=True, text=True)
        if r.returncode != 0:
            log(f"{' '.join(self.ctr(*args, **kw))}: {r.stderr.strip()}")
            r.check_returncode()
        return r


PEERS = []


class Peer:
    """A peer snapshotter daemon, started on an empty root for each run."""

    def __init__(self, name, ctrd, argv, config):
        self.name, self.ctrd, self.argv, self.config = name, ctrd, argv, config
        PEERS.append(self)
        self.proc = None
        self.sock = os.path.join(ctrd.d, f"{name}.sock")
        self.root = os.path.join(SCRATCH, f"{name}-root")

    def start(self):
        self.stop()
        common.retire(self.root)
        os.makedirs(self.root)
        conf = os.path.join(SCRATCH, f"{self.name}.toml")
        with open(conf, "w") as f:
            f.write(self.config)
        log_file = open(os.path.join(SCRATCH, f"{self.name}.log"), "a")
        self.proc = subprocess.Popen(
            [self.argv[0], *self.argv[1:], "--address", self.sock, "--root", self.root,
             "--config", conf], stdout=log_file, stderr=log_file)
        Containerd.wait_socket(self.sock, self.name)
        self.ctrd.restart()

    def stop(self):
        if self.proc is None:
            return
        # SIGINT: the SOCI snapshotter unmounts its layers only then.
        self.proc.send_signal(2)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        with open("/proc/self/mounts") as f:
            left = [l.split(" ")[1] for l in f if f" {self.root}/" in l]
        for m in sorted(left, key=len, reverse=True):
            subprocess.run(["umount", "-l", m], stderr=subprocess.DEVNULL)


def push_soci(direct):
    """The SOCI-enabled image, its index byte for byte: skopeo 1.9 drops the index
    entries' artifactType, which the SOCI snapshotter looks for (the manifests and blobs
    keep their digests; the original index is put over the tag after)."""
    common.sh(f"skopeo copy --quiet --all --dest-tls-verify=false oci:{reg.SOCI} "
              f"docker://{direct}/bench/soci:1")
    idx = json.load(open(os.path.join(reg.SOCI, "index.json")))["manifests"][0]
    blob = os.path.join(reg.SOCI, "blobs/sha256", idx["digest"][7:])
    common.sh(f"curl -sf -X PUT -H 'Content-Type: application/vnd.oci.image.index.v1+json' "
              f"--data-binary @{blob} http://{direct}/v2/bench/soci/manifests/1")


def layer_files(layout):
    """The regular files of each layer of the OCI layout's image, by layer index."""
    import tarfile
    idx = json.load(open(os.path.join(layout, "index.json")))
    blobs = os.path.join(layout, "blobs/sha256")
    man = json.load(open(os.path.join(blobs, idx["manifests"][0]["digest"][7:])))
    out = {}
    for i, layer in enumerate(man["layers"]):
        with tarfile.open(os.path.join(blobs, layer["digest"][7:]), "r:gz") as t:
            out[i] = {m.name.lstrip("./") for m in t if m.isfile()}
    return out


def ensure_estargz(ctrd, direct):
    """The gzip image converted to eStargz by ctr-remote (stargz-snapshotter's converter)
    and pushed as bench/estargz:1."""
    tar = os.path.join(SCRATCH, "gzip.tar")
    subprocess.run(["skopeo", "copy", "--quiet", f"oci:{reg.GZ}:latest",
                    f"oci-archive:{tar}:bench/src:1"], check=True)
    ctrd.run("images", "import", "--no-unpack", "--base-name", "bench/src", tar, ns="convert")
    ctrd.run("images", "convert", "--oci", "--estargz", "bench/src:1",
             f"{direct}/bench/estargz:1", tool="ctr-remote", ns="convert")
    ctrd.run("images", "push", "--plain-http", f"{direct}/bench/estargz:1", ns="convert")
    # Optimized: the files python's start reads first, before a .prefetch.landmark
    # (ctr-remote runs the image to find them, as stargz-snapshotter's users do). Its
    # optimize step (0.12) fails on this image ("failed to sort tar entries: file:
    # usr/lib/python3.11: not found": the record names directories a layer holds no
    # entry for), so the record it writes first is kept to the layers' own files and
    # given to its convert.
    record = os.path.join(SCRATCH, "optimize.record")
    subprocess.run(ctrd.ctr("images", "optimize", "--oci", "--period", "5",
                            "--record-out", record, "--entrypoint", '["python3"]',
                            "--args", json.dumps(CMD[1:]), "bench/src:1", "bench/opt-failed:1",
                            tool="ctr-remote", ns="convert"), capture_output=True)
    files = layer_files(reg.GZ)
    kept = []
    for line in open(record):
        rec = json.loads(line)
        if rec.get("path", "").lstrip("./") in files.get(rec.get("layerIndex"), ()):
            kept.append(line)
    log(f"optimize: {len(kept)} of the files python's start read are prioritized")
    with open(record, "w") as f:
        f.writelines(kept)
    ctrd.run("images", "convert", "--oci", "--estargz", "--estargz-record-in", record,
             "bench/src:1", f"{direct}/bench/estargz-opt:1", tool="ctr-remote", ns="convert")
    ctrd.run("images", "push", "--plain-http", f"{direct}/bench/estargz-opt:1", ns="convert")
    os.remove(tar)
    # containerd shares content between namespaces: what the conversion left would spare
    # the overlayfs pull its download.
    for image in ctrd.run("images", "ls", "-q", ns="convert").stdout.split():
        ctrd.run("images", "rm", "--sync", image, ns="convert")
    left = ctrd.run("content", "ls", "-q", ns="convert").stdout.split()
    if left:
        ctrd.run("content", "rm", *left, ns="convert")


def main():
    for tool in ("containerd", "ctr-remote", "docker-registry", "skopeo"):
        if shutil.which(tool) is None:
            raise SystemExit(f"needs {tool} (apt-get install containerd stargz-snapshotter "
                             "docker-registry skopeo)")
    reg.ensure_images()
    shutil.rmtree(SCRATCH, ignore_errors=True)
    os.makedirs(SCRATCH)
    port = reg.start_registry(SCRATCH)
    direct = f"127.0.0.1:{port}"
    for name, layout in [("gzip", reg.GZ), ("zstd-chunked", reg.ZC)]:
        common.sh(f"skopeo copy --quiet --dest-tls-verify=false "
                  f"oci:{layout} docker://{direct}/bench/{name}:1")
    push_soci(direct)
    peers_dir = os.path.join(WORK, "peers")
    common.sh(f"bash '{HERE}/bench/peers/build_snapshotters.sh' '{peers_dir}'")
    ctrd = Containerd(os.path.join(SCRATCH, "c"))
    stargz = Peer("stargz", ctrd, [os.path.join(peers_dir, "containerd-stargz-grpc"),
                                   "--log-level", "info"], "")
    soci = Peer("soci", ctrd, [os.path.join(peers_dir, "soci-snapshotter-grpc"),
                               "--log-level", "info"],
                f'[content_store]\ntype = "soci"\ncontainerd_address = "{ctrd.d}/c.sock"\n')
    ensure_estargz(ctrd, direct)
    proxy = reg.Proxy(port, scratch=SCRATCH, delay=DELAY, extra=("--mbit", str(MBIT)))
    via = f"127.0.0.1:{proxy.port}"
    store = os.path.join(SCRATCH, "store")
    os.makedirs(store)
    snap_sock = os.path.join(ctrd.d, "s.sock")
    reg.spawn([PKGFS, "snapshotter", "--root", os.path.join(SCRATCH, "snap"),
               "--address", snap_sock, "--store", store],
              stderr=open(os.path.join(SCRATCH, "snapshotter.log"), "w"))
    Containerd.wait_socket(snap_sock, "pkgfs snapshotter")
    # containerd dialled the plugin while it was not up yet (ensure_estargz above), and
    # retries only after a back-off: a run whose first system is pkgfs's (`--only`)
    # failed to pull. Started again, it dials afresh.
    ctrd.restart()

    cache = os.path.join(SCRATCH, "store-cache")
    starts = os.path.join(SCRATCH, "starts")  # records of starts, kept for -again

    def start_records():
        d = os.path.join(cache, "index")
        return sorted(f for f in os.listdir(d) if f.startswith("start-")) if os.path.isdir(d) else []

    def start_store(lazy, again=False):
        common.unmount(store)
        c = cache
        if again:
            # The records the run before left (and nothing else of its caches).
            shutil.rmtree(starts, ignore_errors=True)
            os.makedirs(starts)
            # The store writes what it is still recording as it stops.
            deadline = time.monotonic() + 10
            while len(start_records()) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            kept = start_records()
            if not kept:
                raise RuntimeError("no start recorded by the run before")
            for f in kept:
                shutil.move(os.path.join(c, "index", f), starts)
            hints = os.path.join(c, "disk", "plain-http")
            if os.path.isdir(hints):
                shutil.move(hints, os.path.join(starts, "plain-http"))
        common.retire(c)
        if again:
            if os.path.isdir(os.path.join(starts, "plain-http")):
                os.makedirs(os.path.join(c, "disk"))
                shutil.move(os.path.join(starts, "plain-http"), os.path.join(c, "disk"))
            shutil.copytree(starts, os.path.join(c, "index"))
        # PKGFS_BENCH_STORE_LOG=FILE: the store's log (every request, timed) to FILE.
        trace = os.environ.get("PKGFS_BENCH_STORE_LOG")
        trace = f"--log-level trace --log-file '{trace}' " if trace else ""
        common.sh(f"'{PKGFS}' store -q {trace}--tls-verify=false --io-uring off --disk-cache '{c}/disk' "
                  f"--index-cache '{c}/index' {'--no-background-fetch' if lazy else ''} "
                  f"--start-window {START_WINDOW} "
                  f"'{store}'")

    runs = [0]
    mark = [None]  # the proxy's counters before this run
    sent = [0]  # bytes the registry sent until the last run's first output
    pulled = {}  # the last pull's seconds, by snapshotter
    requests = {}  # the store's (requests, fetches, prefetches) after the last run, by system

    def pull_and_run(snapshotter, image, pull):
        """`pull` (a whole command), then the program in a container; the seconds."""
        runs[0] += 1
        t0 = time.monotonic()
        subprocess.run(pull, check=True, capture_output=True)
        pulled[snapshotter] = time.monotonic() - t0
        out = ctrd.run("run", "--rm", "--snapshotter", snapshotter, image,
                       f"bench-{runs[0]}", *CMD)
        t = time.monotonic() - t0
        assert out.stdout == "ok\n", out
        sent[0] = proxy.sent_since(mark[0])  # by the first output
        return t

    def cleanup(image):
        ctrd.run("images", "rm", "--sync", image)
        # The content store too: the next pull starts from nothing.
        left = ctrd.run("content", "ls", "-q").stdout.split()
        if left:
            ctrd.run("content", "rm", *left)

    def overlayfs():
        image = f"{via}/bench/gzip:1"
        t = pull_and_run("overlayfs", image, ctrd.ctr(
            "images", "pull", "--plain-http", "--snapshotter", "overlayfs", image))
        cleanup(image)
        return t

    def pkgfs(fmt, lazy, again=False):
        image = f"{via}/bench/{fmt}:1"
        start_store(lazy, again)
        common.drop_caches()
        t = pull_and_run("pkgfs", image, ctrd.ctr(
            "images", "rpull", "--plain-http", "--snapshotter", "pkgfs", image, tool="ctr-remote"))
        # The store's requests by then (and after): round trips are what a start waits on.
        st = json.loads(subprocess.run([PKGFS, "status", "--json", store], check=True,
                                       capture_output=True, text=True).stdout)["remote"]
        name = f"pkgfs-{fmt}" + ("-lazy" if lazy else "") + ("-again" if again else "")
        requests[name] = (st["requests"], st["fetches"], st["prefetches"])
        if not again and fmt != "gzip":
            # This start's record, written when its window is over: for the -again run.
            deadline = time.monotonic() + 3 * START_WINDOW_S
            while len(start_records()) < 2 and time.monotonic() < deadline:  # two layers
                time.sleep(0.2)
        cleanup(image)
        return t

    def peer(p, fmt, pull):
        image = f"{via}/bench/{fmt}:1"
        p.start()
        common.drop_caches()
        t = pull_and_run(p.name, image, pull(image))
        cleanup(image)
        p.stop()
        return t

    def stargz_run(fmt="estargz"):
        return peer(stargz, fmt, lambda image: ctrd.ctr(
            "images", "rpull", "--plain-http", "--snapshotter", "stargz", image,
            tool="ctr-remote"))

    def soci_run():
        return peer(soci, "soci", lambda image: [
            os.path.join(peers_dir, "soci-rpull"), "-address", f"{ctrd.d}/c.sock",
            "-namespace", "bench", "-plain-http", image])

    systems = {"overlayfs": overlayfs, "stargz": stargz_run,
               "stargz-opt": lambda: stargz_run("estargz-opt"), "soci": soci_run}
    for f in ("gzip", "zstd-chunked", "soci", "estargz", "estargz-opt"):
        systems[f"pkgfs-{f}"] = (lambda f=f: pkgfs(f, False))
        if f != "gzip":
            systems[f"pkgfs-{f}-again"] = (lambda f=f: pkgfs(f, False, True))
            systems[f"pkgfs-{f}-lazy"] = (lambda f=f: pkgfs(f, True))
    layouts = {"gzip": reg.GZ, "zstd-chunked": reg.ZC, "soci": reg.SOCI}
    layer_bytes = {f: reg.layer_bytes(l) for f, l in layouts.items()}
    only = ARGS[ARGS.index("--only") + 1].split(",") if "--only" in ARGS else None
    if only:
        systems = {k: v for k, v in systems.items() if k in only}
    r = {"rounds": ROUNDS, "delay_ms": DELAY, "mbit": MBIT,
         "measured": time.strftime("%Y-%m-%d %H:%M"),
         "build": subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True).stdout.strip(),
         "layer_bytes": layer_bytes,
         "first_output_s": {k: [] for k in systems}, "pull_s": {k: [] for k in systems},
         "sent_bytes": {k: [] for k in systems}}
    for i in range(ROUNDS):
        for name, fn in systems.items():
            common.drop_caches()
            mark[0] = proxy.counters()
            try:
                t = fn()
            except subprocess.CalledProcessError as e:
                log(f"{name}: failed ({e}: {e.stderr}); left out of this round")
                continue
            r["first_output_s"][name].append(t)
            r["pull_s"][name].append(pulled[name.split("-")[0]])  # by snapshotter
            r["sent_bytes"][name].append(sent[0])
            if name in requests:
                r.setdefault("store_requests", {}).setdefault(name, []).append(requests[name])
        log(f"round {i + 1}:", {k: round(v[-1], 3) for k, v in r["first_output_s"].items() if v})
    r["median_s"] = {k: statistics.median(v) for k, v in r["first_output_s"].items() if v}
    with open(OUT, "w") as f:
        json.dump(r, f, indent=1)
    m = r["median_s"]
    print(f"{2 * DELAY} ms round trip, {MBIT} Mbit/s; layers: "
          + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in layer_bytes.items()))
    base = m.get("overlayfs")
    for k, v in m.items():
        sent = statistics.median(r["sent_bytes"][k])
        vs = f", {base / v:.1f}x sooner than overlayfs" if base and k != "overlayfs" else ""
        pull = statistics.median(r["pull_s"][k])
        print(f"  {k:24} {v:.3f} s ({', '.join(f'{x:.3f}' for x in r['first_output_s'][k])}; "
              f"pull {pull:.3f}); sent {sent / 1e6:.2f} MB{vs}")


if __name__ == "__main__":
    try:
        main()
    finally:
        for peer in PEERS:
            peer.stop()
        common.unmount(os.path.join(SCRATCH, "store"))
        for p in reg.PROCS:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        # Layers the snapshotter bind-mounted, containers' roots containerd left.
        with open("/proc/self/mounts") as f:
            left = sorted((l.split(" ")[1] for l in f if f" {SCRATCH}/" in l), key=len,
                          reverse=True)
        for m in left:
            subprocess.run(["umount", "-l", m], stderr=subprocess.DEVNULL)
