#!/usr/bin/env python3
"""The remote-source targets (issue 22, remote stores), in one run:

    remote.py WORKDIR OUT.json [--rounds N] [--delay-ms MS] [--peer-timeout S] [--skip-peers]
              [--s3-server minio|moto] [--formats zip,zst] [--tree-files N]

The 609 Linux packages (bench/corpus.sh) as ZIP archives (WORKDIR/pkgs-zip-all) and as
pkgfs packages (WORKDIR/pkgs-zst-all), served over HTTP by nginx (autoindex) and over S3
by MinIO (one drive; `go install github.com/minio/minio@latest`) or, without it, moto's
server (objects in memory; its listings scan every key of a bucket, 0.15-0.3 s each with
the tree's 78,579 keys, which would be charged to the S3 peers), each behind
examples/delayproxy adding MS ms (default 20) to every chunk each way, so a request
and its answer take 2 x MS more (`tc netem` is not available in this kernel; the proxy
does what `netem delay MS` on lo would, without a bandwidth limit). Every system reads
through the same proxies, and the proxies count the bytes each one fetched.

pkgfs, for each format, in N rotating rounds (default 3), each step with the page cache
dropped and the served files put back in the server's cache (the server is another
machine's RAM):
  local       `pkgfs mount WORKDIR/pkgs-FORMAT-all` (the baseline)
  http-cold   `pkgfs mount http://…/pkgs-FORMAT-all/` with an empty --disk-cache and
              --no-index-cache
  s3-cold     `pkgfs mount s3://pkgs/FORMAT/` the same way
  http-warm   unmounted, page cache dropped, mounted again on the disk cache http-cold
  s3-warm     filled (still --no-index-cache: only the disk cache is warm)
and in each mount, in order:
  mount       seconds from `pkgfs mount` until the mountpoint lists (the command returns
              when the mount answers); then `pkgfs status`: bytes and requests of objects
              fetched so far (remote.bytes against the archives' bytes)
  small       open and read of include/linux/kernel.h (16 KiB), checked against the tree
  subtree     `tar -C MNT/kernel -cf - . > /dev/zero`: one directory, 562 files, 12 MB
  find        `find MNT | wc -l`
  read_all    `tar -C MNT -cf - . > /dev/zero` (as bench/peers.py), then remote.bytes
All pkgfs mounts take requests through /dev/fuse (--io-uring off), as the peers do.

Then, N times: a plain download of every archive through the same delayed proxy (`curl
--parallel --parallel-max 32` over HTTP; boto3 with 32 threads over S3), written to a
directory. Once: the proxy's own cost, pkgfs http-cold straight to nginx and through the
proxy without delay, and the plain HTTP download the same two ways.

Peers, once each (their subtree, find and read-all cut at --peer-timeout seconds, default 120;
the share done by then is recorded: lines find printed, bytes tar wrote), over the
extracted tree served as files (WORKDIR/linux through nginx; uploaded to the bucket
`linux` of the S3 server, regular files only: its 56 symlinks are not objects), the same
operations, cold then warm:
  rclone-http  `rclone mount :http: --http-url … --read-only --vfs-cache-mode full`
  rclone-s3    `rclone mount :s3:linux --s3-provider Other …` the same way
  s3fs         `s3fs linux MNT -o ro,use_path_request_style,use_cache=DIR`
warm being a remount on the same cache directory after the page cache is dropped. A
warm find or read-all is only run if the cold one finished (a cut read-all leaves a partial
cache; their listings are kept in memory only, so a remount lists again: a warm find that
the cold one did not finish would not either).
--tree-files N uploads only the first N files of the tree (to try the script quickly; the
S3 peers then see a partial tree). Results go to OUT.json; a summary to standard output. Needs root, nginx, minio or
moto_server, boto3, curl, rclone and s3fs (`apt-get install rclone s3fs`).
"""

import concurrent.futures
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import drop_caches, log, sh  # noqa: E402

WORK = sys.argv[1]
OUT = sys.argv[2]
ARGS = sys.argv[3:]


def arg(name, default, kind=int):
    return kind(ARGS[ARGS.index(name) + 1]) if name in ARGS else default


ROUNDS = arg("--rounds", 3)
DELAY_MS = arg("--delay-ms", 20)
PEER_TIMEOUT = arg("--peer-timeout", 120.0, float)
SKIP_PEERS = "--skip-peers" in ARGS
TREE_FILES = arg("--tree-files", None)
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKGFS = os.path.join(HERE, "target/release/pkgfs")
DELAYPROXY = os.path.join(HERE, "target/release/examples/delayproxy")
# The same 609 packages as ZIP archives and as pkgfs packages (bench/corpus.sh).
FORMATS = arg("--formats", "zip,zst", str).split(",")
PKGS = {f: os.path.join(WORK, f"pkgs-{f}-all") for f in FORMATS}
TREE = os.path.join(WORK, "linux")
SCRATCH = os.path.join(WORK, "remote-bench")
MNT = os.path.join(SCRATCH, "mnt")
SMALL = "include/linux/kernel.h"
SUBTREE = "kernel"
# MinIO if found (`go install github.com/minio/minio@latest`), else moto's server: moto
# lists a prefix by scanning every key of the bucket (0.15-0.3 s a listing with the tree's
# 78,579 keys), which the S3 peers, listing directory by directory, would be charged for.
MINIO = shutil.which("minio") or next(
    (p for p in [os.path.expanduser("~/go/bin/minio")] if os.access(p, os.X_OK)), None)
S3_SERVER = arg("--s3-server", "minio" if MINIO else "moto", str)
# Children still running (servers, proxies, peer daemons), stopped in the finally.
CHILDREN = []


def unmount():
    common.unmount(MNT)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, what, proc=None):
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(what + " never listened")


def spawn(cmd, env=None, log_to=None):
    out = open(log_to, "ab") if log_to else subprocess.DEVNULL
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                         start_new_session=True)
    CHILDREN.append(p)
    return p


def stop(p, sig=signal.SIGTERM):
    """SIGTERM to the child (nginx's master stops its workers), SIGKILL after 10 s."""
    if p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    if p in CHILDREN:
        CHILDREN.remove(p)


# ---------------------------------------------------------------- servers and proxies

class Nginx:
    """nginx serving WORKDIR with autoindex, as mount-tests/remote.rs runs it."""

    def __init__(self):
        d = os.path.join(SCRATCH, "nginx")
        os.makedirs(os.path.join(d, "logs"), exist_ok=True)
        os.makedirs(os.path.join(d, "tmp"), exist_ok=True)
        self.port = free_port()
        with open(os.path.join(d, "nginx.conf"), "w") as f:
            f.write(f"daemon off; pid {d}/nginx.pid; error_log {d}/logs/error.log;\n"
                    "worker_processes 2;\n"
                    "events {}\n"
                    f"http {{ access_log off; client_body_temp_path {d}/tmp;\n"
                    f"  proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp; uwsgi_temp_path {d}/tmp;\n"
                    f"  scgi_temp_path {d}/tmp;\n"
                    f"  server {{ listen 127.0.0.1:{self.port}; root {WORK}; autoindex on; }} }}\n")
        self.proc = spawn(["nginx", "-c", os.path.join(d, "nginx.conf"), "-p", d])
        wait_listening(self.port, "nginx", self.proc)


class Proxy:
    """examples/delayproxy in front of a port, adding delay_ms to every chunk each way (a
    request and its answer take 2 x delay_ms more, as netem on loopback would); its stats
    file (connections, bytes to the server, bytes to the client) counts what a system
    fetched."""

    def __init__(self, name, upstream, delay_ms):
        self.stats = os.path.join(SCRATCH, f"proxy-{name}.stats")
        self.port = free_port()
        self.proc = spawn([DELAYPROXY, str(self.port), str(upstream), str(delay_ms), self.stats])
        wait_listening(self.port, "delayproxy", self.proc)

    def counters(self):
        time.sleep(0.12)  # the proxy rewrites its stats every 50 ms
        try:
            with open(self.stats) as f:
                return [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            return [0, 0, 0]

    def mark(self):
        return self.counters()

    def since(self, mark):
        """Connections opened and bytes each way since mark."""
        now = self.counters()
        return {"connections": now[0] - mark[0], "bytes_to_server": now[1] - mark[1],
                "bytes": now[2] - mark[2]}


class Moto:
    """moto's S3 server, every object held in memory (a dropped page cache must not make
    the server cold)."""
    name, data, user, password = "moto", None, "test", "testtest"

    def __init__(self):
        self.port = free_port()
        env = dict(os.environ, MOTO_S3_DEFAULT_KEY_BUFFER_SIZE=str(256 << 20))
        self.proc = spawn(["moto_server", "-H", "127.0.0.1", "-p", str(self.port)], env=env,
                          log_to=os.path.join(SCRATCH, "moto.log"))
        wait_listening(self.port, "moto", self.proc)


class Minio:
    """MinIO on one drive in SCRATCH/minio: objects on disk (put back in the page cache
    after each drop, as nginx's files are)."""
    name, user, password = "minio", "pkgfsbench", "pkgfsbench"

    def __init__(self):
        self.port = free_port()
        self.data = os.path.join(SCRATCH, "minio")
        os.makedirs(self.data)
        env = dict(os.environ, MINIO_ROOT_USER=self.user, MINIO_ROOT_PASSWORD=self.password,
                   MINIO_BROWSER="off")
        self.proc = spawn([MINIO, "server", self.data, "--address", f"127.0.0.1:{self.port}",
                           "--console-address", f"127.0.0.1:{free_port()}"], env=env,
                          log_to=os.path.join(SCRATCH, "minio.log"))
        wait_listening(self.port, "minio", self.proc)


def s3_client(server, port, pool=64):
    import boto3
    from botocore.config import Config
    return boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}",
                        aws_access_key_id=server.user, aws_secret_access_key=server.password,
                        region_name="us-east-1", config=Config(max_pool_connections=pool))


def upload(s3, bucket, root, prefix, paths, threads=16):
    def put(p):
        with open(p, "rb") as f:
            s3.put_object(Bucket=bucket, Key=prefix + os.path.relpath(p, root), Body=f.read())
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        list(ex.map(put, paths))
    return time.monotonic() - t0


def regular_files(root):
    out = []
    for d, _, files in os.walk(root):
        for n in files:
            p = os.path.join(d, n)
            if os.path.isfile(p) and not os.path.islink(p):
                out.append(p)
    out.sort()
    return out


# ---------------------------------------------------------------- workloads

def capped(cmd, timeout, stdout_path):
    """Run cmd (bash) with stdout and stderr to files; (seconds or None if cut at timeout)."""
    with open(stdout_path, "wb") as out, open(stdout_path + ".err", "wb") as err:
        t0 = time.monotonic()
        p = subprocess.Popen(["bash", "-c", cmd], stdout=out, stderr=err, start_new_session=True)
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return None
        t = time.monotonic() - t0
    if rc != 0:
        tail = open(stdout_path + ".err", "rb").read().decode(errors="replace")[-300:]
        log(f"  ({cmd!r} exited {rc}: {tail.strip()})")
    return t


def op_mount(start, timeout):
    """start() begins mounting; seconds until the mountpoint lists."""
    t0 = time.monotonic()
    proc = start()
    returned = time.monotonic() - t0
    while True:
        try:
            if os.listdir(MNT):
                return time.monotonic() - t0, returned
        except OSError:
            pass
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"mount exited with {proc.returncode}")
        if time.monotonic() - t0 > timeout:
            return None, returned
        time.sleep(0.005)


def op_small():
    t0 = time.monotonic()
    with open(os.path.join(MNT, SMALL), "rb") as f:
        data = f.read()
    t = time.monotonic() - t0
    with open(os.path.join(TREE, SMALL), "rb") as f:
        if data != f.read():
            raise RuntimeError(f"{SMALL}: the mount's content differs from the tree's")
    return t


def op_find(timeout):
    out = os.path.join(SCRATCH, "find.out")
    t = capped(f"find '{MNT}'", timeout, out)
    with open(out, "rb") as f:
        lines = f.read().count(b"\n")
    return t, lines


CHECKPOINT = 100  # tar records (10 KiB each) between progress lines: every ~1 MB


def op_read_all(timeout, sub=""):
    """`tar -C MNT/sub -cf - . > /dev/zero`; seconds (None if cut) and the bytes tar wrote
    (from its checkpoints, or its --totals when it finished)."""
    out = os.path.join(SCRATCH, "tar.out")
    t = capped(f"tar --totals --checkpoint={CHECKPOINT} -C '{os.path.join(MNT, sub)}' -cf - . > /dev/zero",
               timeout, out)
    err = open(out + ".err", "rb").read().decode(errors="replace")
    total = re.search(r"Total bytes written: (\d+)", err)
    if total:
        done = int(total.group(1))
    else:
        marks = re.findall(r"checkpoint (\d+)", err)
        done = int(marks[-1]) * 10240 if marks else 0  # the checkpoint's number is its record
    return t, done


def status():
    for _ in range(20):
        p = subprocess.run([PKGFS, "status", "--json", MNT], capture_output=True)
        if p.returncode == 0:
            return json.loads(p.stdout)
        log("  (pkgfs status: " + p.stderr.decode(errors="replace").strip() + ")")
        time.sleep(0.25)
    raise RuntimeError("pkgfs status keeps failing")


def remote_counters(st):
    r = st.get("remote")
    if not r:
        return {"archive_bytes_read": st.get("archive_bytes_read")}
    dc = r.get("disk_cache") or {}
    return {"bytes": r["bytes"], "requests": r["requests"], "fetches": r.get("fetches"),
            "retries": r.get("retries"), "errors": r.get("errors"),
            "disk_cache_hits": dc.get("hits"), "disk_cache_misses": dc.get("misses"),
            "disk_cache_bytes_read": dc.get("bytes_read")}


def warm_server(paths):
    """Put what the server serves back in its page cache (after a drop)."""
    for p in paths:
        if os.path.isdir(p):
            sh(f"tar -C '{p}' -cf - . > /dev/zero")
        else:
            sh(f"cat '{p}' > /dev/null")


# ---------------------------------------------------------------- pkgfs runs

def pkgfs_run(source, cache, env=None, server=(), proxy=None, fresh=True):
    """One mount of pkgfs, the four operations; a dict of results."""
    unmount()
    if cache and fresh:
        common.retire(cache)
    drop_caches()
    warm_server(server)
    args = [PKGFS, "mount", "-q", "--io-uring", "off", "--no-index-cache",
            "--log-file", os.path.join(SCRATCH, "pkgfs.log")]
    if cache:
        args += ["--disk-cache", cache]
    args += [source, MNT]
    full_env = dict(os.environ, **(env or {}))
    mark = proxy.mark() if proxy else None

    def start():
        subprocess.run(args, check=True, env=full_env)

    r = {}
    r["mount_s"], r["mount_cmd_s"] = op_mount(start, 120)
    st = status()
    r["transport"] = st.get("transport")
    r["at_mount"] = remote_counters(st)
    if proxy:
        r["at_mount"]["proxy"] = proxy.since(mark)
    r["small_s"] = op_small()
    r["subtree_s"], r["subtree_tar_bytes"] = op_read_all(600, SUBTREE)
    r["find_s"], r["find_lines"] = op_find(600)
    r["read_all_s"], r["tar_bytes"] = op_read_all(900)
    st = status()
    r["after_read_all"] = remote_counters(st)
    if proxy:
        r["after_read_all"]["proxy"] = proxy.since(mark)
    unmount()
    return r


# ---------------------------------------------------------------- peers

def peer_run(name, start_cmd, server, proxy, cache, fresh, find=True, read_all=True):
    """One mount of a peer (a FUSE daemon in the foreground, our child)."""
    unmount()
    if fresh:
        common.retire(cache)
    os.makedirs(cache, exist_ok=True)
    drop_caches()
    warm_server(server)
    mark = proxy.mark()
    holder = {}

    def start():
        # This machine sets AWS_CA_BUNDLE; rclone's S3 client fails on it (plain http here).
        env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
        holder["p"] = spawn(start_cmd, env=env, log_to=os.path.join(SCRATCH, name + ".log"))
        return holder["p"]

    r = {}
    try:
        r["mount_s"], _ = op_mount(start, PEER_TIMEOUT)
        if r["mount_s"] is None:
            r["error"] = f"did not list in {PEER_TIMEOUT:.0f} s"
            return r
        r["at_mount"] = {"proxy": proxy.since(mark)}
        r["small_s"] = op_small()
        r["subtree_s"], r["subtree_tar_bytes"] = op_read_all(PEER_TIMEOUT, SUBTREE)
        if find:
            r["find_s"], r["find_lines"] = op_find(PEER_TIMEOUT)
        if read_all:
            r["read_all_s"], r["tar_bytes"] = op_read_all(PEER_TIMEOUT)
        r["after"] = {"proxy": proxy.since(mark)}
    except (OSError, RuntimeError) as e:
        r["error"] = str(e)
    finally:
        subprocess.run(["fusermount", "-u", MNT], stderr=subprocess.DEVNULL)
        unmount()
        if "p" in holder:
            stop(holder["p"])
    log(f"  {name}: {short(r)}")
    return r


def short(r):
    keys = ("mount_s", "small_s", "subtree_s", "find_s", "find_lines", "read_all_s", "tar_bytes", "error")
    return {k: (round(r[k], 3) if isinstance(r[k], float) else r[k]) for k in keys if k in r}


# ---------------------------------------------------------------- plain downloads

def curl_download(base, paths, dest):
    """Every archive of paths (local files, for their names) fetched from base by curl."""
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    names = [os.path.basename(p) for p in paths]
    cfg = os.path.join(SCRATCH, "curl.cfg")
    with open(cfg, "w") as f:
        for n in names:
            f.write(f'url = "{base}{n}"\noutput = "{os.path.join(dest, n)}"\n')
    drop_caches()
    warm_server(paths)
    t0 = time.monotonic()
    sh(f"curl -sS --no-progress-meter --fail --parallel --parallel-max 32 -K '{cfg}'")
    t = time.monotonic() - t0
    got = sum(os.path.getsize(os.path.join(dest, n)) for n in names)
    shutil.rmtree(dest)
    return t, got


def s3_download(server, port, prefix, paths, dest):
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    names = [os.path.basename(p) for p in paths]
    s3 = s3_client(server, port, 32)
    drop_caches()
    warm_server([os.path.join(server.data, "pkgs", prefix)] if server.data else [])
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(32) as ex:
        list(ex.map(lambda n: s3.download_file("pkgs", prefix + n, os.path.join(dest, n)), names))
    t = time.monotonic() - t0
    got = sum(os.path.getsize(os.path.join(dest, n)) for n in names)
    shutil.rmtree(dest)
    return t, got


# ---------------------------------------------------------------- main

def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def stats(xs):
    ys = [x for x in xs if x is not None]
    return {"median": med(ys), "min": min(ys) if ys else None, "max": max(ys) if ys else None,
            "all": xs}


def main():
    for tool in ("nginx", "curl") + (("moto_server",) if S3_SERVER == "moto" else ()) + \
            (() if SKIP_PEERS else ("rclone", "s3fs")):
        if not shutil.which(tool):
            sys.exit(f"{tool} is not installed")
    if S3_SERVER == "minio" and not MINIO:
        sys.exit("minio is not installed")
    if not os.access(DELAYPROXY, os.X_OK):
        sys.exit("no " + DELAYPROXY + ": cargo build --release --examples")
    unmount()
    shutil.rmtree(SCRATCH, ignore_errors=True)
    os.makedirs(MNT)
    # nginx serves as nobody.
    sh(f"chmod -R a+rX {' '.join(PKGS.values())} '{TREE}'; chmod a+rx '{WORK}'")
    paths = {f: sorted(os.path.join(d, n) for n in os.listdir(d) if os.path.isfile(os.path.join(d, n)))
             for f, d in PKGS.items()}
    r = {"measured": time.strftime("%Y-%m-%d %H:%M"), "rounds": ROUNDS, "delay_ms": DELAY_MS,
         "delay": "examples/delayproxy: every chunk each way DELAY_MS later (a round trip 2 x DELAY_MS)",
         "peer_timeout_s": PEER_TIMEOUT, "formats": FORMATS,
         "packages": {f: len(p) for f, p in paths.items()},
         "archive_bytes": {f: sum(os.path.getsize(x) for x in p) for f, p in paths.items()},
         "small_file": SMALL, "subtree": SUBTREE, "read_all": "tar -C MNT -cf - . > /dev/zero",
         "versions": {
             "pkgfs": subprocess.run([PKGFS, "--version"], capture_output=True, text=True).stdout.strip(),
             "nginx": subprocess.run(["nginx", "-v"], capture_output=True, text=True).stderr.strip()}}
    if not SKIP_PEERS:
        r["versions"]["rclone"] = subprocess.run(["rclone", "version"], capture_output=True, text=True).stdout.splitlines()[0]
        r["versions"]["s3fs"] = subprocess.run(["s3fs", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    try:
        nginx = Nginx()
        store = Minio() if S3_SERVER == "minio" else Moto()
        r["s3_server"] = store.name
        if store.name == "minio":
            r["versions"]["minio"] = subprocess.run([MINIO, "--version"], capture_output=True,
                                                    text=True).stdout.splitlines()[0]
        # What to put back in the S3 server's page cache after a drop (MinIO: a directory
        # per bucket).
        s3_warm_tree = [os.path.join(store.data, "linux")] if store.data else []
        http = Proxy("http", nginx.port, DELAY_MS)
        http0 = Proxy("http-nodelay", nginx.port, 0)
        s3p = Proxy("s3", store.port, DELAY_MS)
        s3 = s3_client(store, store.port)
        s3.create_bucket(Bucket="pkgs")
        r["upload_archives_s"] = {}
        for f, p in paths.items():
            log(f"uploading {len(p)} {f} archives to {store.name}")
            r["upload_archives_s"][f] = upload(s3, "pkgs", PKGS[f], f + "/", p)
        if not SKIP_PEERS:
            files = regular_files(TREE)[:TREE_FILES]
            s3.create_bucket(Bucket="linux")
            log(f"uploading {len(files)} files of the tree to {store.name} (about 5 minutes)")
            r["upload_tree"] = {"files": len(files), "bytes": sum(os.path.getsize(p) for p in files),
                                "seconds": upload(s3, "linux", TREE, "", files)}
            # The server's own cost of a listing in that bucket, without the proxy.
            t0 = time.monotonic()
            for _ in range(10):
                s3.list_objects_v2(Bucket="linux", Prefix="include/linux/", Delimiter="/")
            r["server_listing_s"] = (time.monotonic() - t0) / 10
        s3_env = {"AWS_ACCESS_KEY_ID": store.user, "AWS_SECRET_ACCESS_KEY": store.password,
                  "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3p.port}"}
        runs = {}
        for f in FORMATS:
            http_src = f"http://127.0.0.1:{http.port}/pkgs-{f}-all/"
            s3_src = f"s3://pkgs/{f}/"
            s3_warm = [os.path.join(store.data, "pkgs", f)] if store.data else []
            ch, cs = os.path.join(SCRATCH, f"dc-http-{f}"), os.path.join(SCRATCH, f"dc-s3-{f}")
            pp = paths[f]
            runs[f] = {
                "local": lambda d=PKGS[f]: pkgfs_run(d, None),
                "http-cold": lambda s=http_src, c=ch, pp=pp: pkgfs_run(s, c, server=pp, proxy=http),
                "http-warm": lambda s=http_src, c=ch, pp=pp: pkgfs_run(s, c, server=pp, proxy=http, fresh=False),
                "s3-cold": lambda s=s3_src, c=cs, w=s3_warm: pkgfs_run(s, c, env=s3_env, server=w, proxy=s3p),
                "s3-warm": lambda s=s3_src, c=cs, w=s3_warm: pkgfs_run(s, c, env=s3_env, server=w, proxy=s3p,
                                                                     fresh=False),
            }
        order = [["local"], ["http-cold", "http-warm"], ["s3-cold", "s3-warm"]]
        pk = {f: {k: [] for k in runs[f]} for f in FORMATS}
        for i in range(ROUNDS):
            log(f"== pkgfs round {i + 1}")
            for group in order[i % 3:] + order[:i % 3]:
                for f in FORMATS:
                    for k in group:
                        res = runs[f][k]()
                        pk[f][k].append(res)
                        log(f"  {f} {k}: {short(res)}")
        r["pkgfs"] = pk
        # Plain downloads.
        dl = {f: {"http": [], "s3": []} for f in FORMATS}
        for i in range(ROUNDS):
            for f in FORMATS:
                dl[f]["http"].append(curl_download(f"http://127.0.0.1:{http.port}/pkgs-{f}-all/", paths[f],
                                                   os.path.join(SCRATCH, "dl")))
                dl[f]["s3"].append(s3_download(store, s3p.port, f + "/", paths[f], os.path.join(SCRATCH, "dl")))
                log(f"  plain download of the {f} archives: http {dl[f]['http'][-1][0]:.2f} s, "
                    f"s3 {dl[f]['s3'][-1][0]:.2f} s")
        r["download"] = dl
        # The proxy's own cost: pkgfs and curl straight to nginx, and through the proxy
        # without delay (the first format).
        log("== proxy cost")
        f = FORMATS[0]
        base = f"/pkgs-{f}-all/"
        pc = {"format": f}
        pc["pkgfs-direct"] = pkgfs_run(f"http://127.0.0.1:{nginx.port}{base}", os.path.join(SCRATCH, "dc-direct"),
                                       server=paths[f])
        pc["pkgfs-proxy-nodelay"] = pkgfs_run(f"http://127.0.0.1:{http0.port}{base}",
                                              os.path.join(SCRATCH, "dc-nodelay"), server=paths[f], proxy=http0)
        for k in ("pkgfs-direct", "pkgfs-proxy-nodelay"):
            log(f"  {k}: {short(pc[k])}")
        pc["download-direct"] = curl_download(f"http://127.0.0.1:{nginx.port}{base}", paths[f],
                                              os.path.join(SCRATCH, "dl"))
        pc["download-proxy-nodelay"] = curl_download(f"http://127.0.0.1:{http0.port}{base}", paths[f],
                                                     os.path.join(SCRATCH, "dl"))
        log(f"  download direct {pc['download-direct'][0]:.2f} s, through the proxy without delay "
            f"{pc['download-proxy-nodelay'][0]:.2f} s")
        r["proxy_cost"] = pc
        # Peers over the extracted tree.
        if not SKIP_PEERS:
            conf = os.path.join(SCRATCH, "rclone.conf")
            open(conf, "w").close()
            pw = os.path.join(SCRATCH, "s3fs.passwd")
            with open(pw, "w") as f:
                f.write(f"{store.user}:{store.password}\n")
            os.chmod(pw, 0o600)
            rc = ["rclone", "mount", "--config", conf, "--read-only", "--vfs-cache-mode", "full"]
            s3_url = f"http://127.0.0.1:{s3p.port}"
            peers = {
                "rclone-http": (lambda c: rc + [":http:", MNT, "--http-url", f"http://127.0.0.1:{http.port}/linux/",
                                                "--cache-dir", c], http, [TREE]),
                "rclone-s3": (lambda c: rc + [":s3:linux", MNT, "--s3-provider", "Other", "--s3-endpoint", s3_url,
                                              "--s3-access-key-id", store.user, "--s3-secret-access-key",
                                              store.password, "--s3-region", "us-east-1", "--cache-dir", c],
                              s3p, s3_warm_tree),
                "s3fs": (lambda c: ["s3fs", "linux", MNT, "-f", "-o",
                                    f"ro,url={s3_url},use_path_request_style,passwd_file={pw},"
                                    f"use_cache={c},endpoint=us-east-1"], s3p, s3_warm_tree),
            }
            pr = {}
            for name, (cmd, proxy, server) in peers.items():
                log(f"== {name}")
                c = os.path.join(SCRATCH, "cache-" + name)
                cold = peer_run(name + "-cold", cmd(c), server, proxy, c, True)
                warm = peer_run(name + "-warm", cmd(c), server, proxy, c, False,
                                find=cold.get("find_s") is not None,
                                read_all=cold.get("read_all_s") is not None)
                pr[name] = {"cold": cold, "warm": warm}
            r["peers"] = pr
    finally:
        try:
            unmount()
        finally:
            for p in list(CHILDREN):
                stop(p)
    shutil.rmtree(SCRATCH, ignore_errors=True)
    summarize(r)
    with open(OUT, "w") as f:
        json.dump(r, f, indent=1)
    report(r)


OPS = ("mount_s", "small_s", "subtree_s", "find_s", "read_all_s")


def summarize(r):
    r["summary"] = {}
    for f, pk in r["pkgfs"].items():
        s = {}
        for k, runs in pk.items():
            s[k] = {op: stats([x[op] for x in runs]) for op in OPS}
            if k != "local":
                b = [x["at_mount"]["bytes"] for x in runs]
                s[k]["bytes_at_mount"] = stats(b)
                s[k]["share_at_mount"] = stats([x / r["archive_bytes"][f] for x in b])
                s[k]["requests_at_mount"] = stats([x["at_mount"]["requests"] for x in runs])
                s[k]["proxy_bytes_at_mount"] = stats([x["at_mount"]["proxy"]["bytes"] for x in runs])
                s[k]["bytes_after_read_all"] = stats([x["after_read_all"]["bytes"] for x in runs])
                s[k]["proxy_bytes_after_read_all"] = stats([x["after_read_all"]["proxy"]["bytes"] for x in runs])
                # Each remote run against the local run of its round.
                s[k]["ratio_to_local"] = {
                    op: stats([a[op] / b[op] if a[op] and b[op] else None for a, b in zip(runs, pk["local"])])
                    for op in OPS}
        r["summary"][f] = s
    # Peers against pkgfs of the same protocol and phase (medians): peer / pkgfs.
    vs = {}
    for name, v in r.get("peers", {}).items():
        proto = "http" if "http" in name else "s3"
        vs[name] = {}
        for f, s in r["summary"].items():
            for phase in ("cold", "warm"):
                base = s[f"{proto}-{phase}"]
                vs[name][f"{phase}/{f}"] = {
                    op: (v[phase][op] / base[op]["median"]
                         if v[phase].get(op) is not None and base[op]["median"] else None) for op in OPS}
    r["peer_over_pkgfs"] = vs
    r["download_summary"] = {f: {k: stats([t for t, _ in x]) for k, x in v.items()}
                             for f, v in r["download"].items()}


def fmt(x, unit="s", nd=3):
    return "-" if x is None else f"{x:.{nd}f} {unit}"


def report(r):
    print(f"{r['delay_ms']} ms added each way by delayproxy; pkgfs: median of {r['rounds']} rounds (min-max)")
    for f, s in r["summary"].items():
        print(f"{f}: {r['packages'][f]} packages, {r['archive_bytes'][f] / 1e6:.1f} MB")
        for k, v in s.items():
            line = f"  {k:10}"
            for op in OPS:
                m = v[op]
                line += f" {op[:-2]} {fmt(m['median'])} ({fmt(m['min'], '')}-{fmt(m['max'], '')})"
            if "share_at_mount" in v:
                line += (f"; at mount {v['bytes_at_mount']['median'] / 1e6:.2f} MB = "
                         f"{100 * v['share_at_mount']['median']:.2f} % in "
                         f"{v['requests_at_mount']['median']:.0f} requests")
            print(line)
        for k in ("http-warm", "s3-warm", "http-cold", "s3-cold"):
            rt = s[k]["ratio_to_local"]
            print(f"  {k} / local: " + ", ".join(
                f"{op[:-2]} {rt[op]['median']:.2f}x ({rt[op]['min']:.2f}-{rt[op]['max']:.2f})"
                for op in OPS if rt[op]["median"] is not None))
        d = r["download_summary"][f]
        print(f"  plain download of the archives: http (curl, 32 parallel) {fmt(d['http']['median'])}, "
              f"s3 (boto3, 32 threads) {fmt(d['s3']['median'])}")
    pc = r["proxy_cost"]
    print(f"proxy cost ({pc['format']}), pkgfs http cold: direct mount {fmt(pc['pkgfs-direct']['mount_s'])} read-all "
          f"{fmt(pc['pkgfs-direct']['read_all_s'])}; proxy without delay mount "
          f"{fmt(pc['pkgfs-proxy-nodelay']['mount_s'])} read-all {fmt(pc['pkgfs-proxy-nodelay']['read_all_s'])}; "
          f"curl download direct {fmt(pc['download-direct'][0])}, proxy {fmt(pc['download-proxy-nodelay'][0])}")
    for name, v in r.get("peers", {}).items():
        for phase in ("cold", "warm"):
            x = v[phase]
            cut = lambda t: "did not finish in %.0f s" % r["peer_timeout_s"] if t is None else fmt(t)
            line = f"  {name} {phase}: mount {fmt(x.get('mount_s'))}, small {fmt(x.get('small_s'))}"
            if "subtree_s" in x:
                line += f", subtree {cut(x['subtree_s'])}"
            if "find_s" in x:
                line += f", find {cut(x['find_s'])} ({x['find_lines']} lines)"
            if "read_all_s" in x:
                line += f", read-all {cut(x['read_all_s'])} ({x['tar_bytes'] / 1e6:.0f} MB of tar)"
            if "error" in x:
                line += f" [{x['error']}]"
            print(line)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *a: sys.exit("terminated"))
    main()
