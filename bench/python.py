#!/usr/bin/env python3
"""A Python environment from a lock file, ready to import (issue 36), in one run:

    python.py WORKDIR OUT.json [--rounds N]

The wheels: the 64 of the mount tests' large set (mount-tests/python/jupyter-lock.txt,
which `uv pip compile --generate-hashes` wrote: a Jupyter kernel and console, numpy,
cryptography, plotly…), `pip download`ed once. Each step makes an environment at the
same path from that lock, offline, and is timed until `python -c 'import numpy,
jupyter_client, cryptography'` (the issue's) has run
(the environment in use, not only written), then that import a second time, N rounds
(default 3), median, page cache dropped before each; each time is split into making the
environment, the first import and the second (a read-only environment without bytecode
compiles every module in memory at every start; a writable one keeps what the first
import compiled):
  pip           python -m venv --without-pip; pip --python V install --no-deps
                --require-hashes --no-index --find-links WHEELS -r LOCK (compiles)
  pip-nocompile the same with --no-compile
  uv-cold       uv venv; uv pip install --no-deps --offline --find-links WHEELS -r LOCK,
                an empty uv cache (uv unpacks every wheel into its cache, links from it)
  uv-warm       the same with the cache of the cold run (uv's usual case)
  pkgfs-cold    pkgfs mount --layout python --lockfile LOCK WHEELS V, an empty index
                cache (every wheel read and hashed; the bytecode compiled in the
                background while the imports run)
  pkgfs-warm    the same with an index cache holding every wheel's bytecode (made by
                one mount first, waited for), the tree folded at every mount
                (--no-kept-tree)
  pkgfs-kept    the same, the tree kept by one mount first and loaded whole (what a
                mount of unchanged wheels does by default)
  pkgfs-nocompile  the same with --no-compile (no bytecode served)
  disk          disk used by ten environments of the lock at ten paths (and by one):
                uv's (its cache included), pkgfs's (its index cache: the bytecode
                packs); pip's: one environment's size, as nothing is shared
`--only NAME,NAME` runs only those steps. Results go to OUT.json; a summary to standard
output.
"""

import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import hashlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import drop_caches, log, sh  # noqa: E402

WORK = os.path.join(sys.argv[1], "python-jupyter")
OUT = sys.argv[2]
ROUNDS = common.arg(sys.argv[3:], "--rounds", 3)
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKGFS = os.path.join(HERE, "target/release/pkgfs")
WHEELS = os.path.join(WORK, "wheels")
LOCK = os.path.join(HERE, "mount-tests/python/jupyter-lock.txt")
VENV = os.path.join(WORK, "venv")
TOOLS = os.path.join(WORK, "tools")
UV_CACHE = os.path.join(WORK, "uv-cache")
INDEX_CACHE = os.path.join(WORK, "index-cache")
PY = subprocess.run(["python3", "-c", "import sys; print(sys.executable)"],
                    capture_output=True, text=True, check=True).stdout.strip()
IMPORT = "import numpy, jupyter_client, cryptography"


def make_wheels():
    stamp = os.path.join(WORK, "stamp")
    want = hashlib.sha256(open(LOCK, "rb").read()).hexdigest()
    if os.path.exists(stamp) and open(stamp).read() == want:
        return
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WHEELS)
    pip = [PY, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(pip + ["download", "-q", "--only-binary", ":all:", "--no-deps", "-d",
                          WHEELS, "-r", LOCK], check=True)
    subprocess.run([PY, "-m", "venv", TOOLS], check=True)
    subprocess.run([os.path.join(TOOLS, "bin/pip"), "install", "-q", "uv==0.9.5"], check=True)
    with open(stamp, "w") as f:
        f.write(want)


def clear_venv():
    common.unmount(VENV)
    shutil.rmtree(VENV, ignore_errors=True)


# As users run it: an interpreter that writes bytecode where it can (a writable
# environment keeps what its first import compiled).
IMPORT_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def ready():
    subprocess.run([os.path.join(VENV, "bin/python"), "-c", IMPORT], check=True,
                   stdout=subprocess.DEVNULL, env=IMPORT_ENV)


def step(make):
    """Seconds to make the environment, to import, and to import again."""
    clear_venv()
    drop_caches()
    t0 = time.monotonic()
    make()
    t1 = time.monotonic()
    ready()
    t2 = time.monotonic()
    ready()
    return (t1 - t0, t2 - t1, time.monotonic() - t2)


def pip(extra):
    def make():
        sh(f"'{PY}' -m venv --without-pip '{VENV}'")
        sh(f"'{PY}' -m pip --disable-pip-version-check --python '{VENV}/bin/python' install -q "
           f"--no-deps --require-hashes --no-index --find-links '{WHEELS}' -r '{LOCK}' {extra}")
    return make


def uv():
    return lambda: make_uv(VENV)


def pkgfs(extra="", at=VENV):
    def make():
        os.makedirs(at)
        sh(f"'{PKGFS}' mount --layout python --python '{PY}' --lockfile '{LOCK}' "
           f"-o index_cache='{INDEX_CACHE}' {extra} '{WHEELS}' '{at}'")
    return make


def compiling():
    """Whether a mount's bytecode compile is running."""
    return subprocess.run(["pgrep", "-f", "py_compile"], capture_output=True).returncode == 0


def bytecode_made():
    """Fill the index cache with every wheel's bytecode: one mount, waited for."""
    clear_venv()
    pkgfs()()
    packs, still = -1, 0
    while still < 3:
        time.sleep(1)
        n = len(glob.glob(os.path.join(INDEX_CACHE, "python", "*.pyc.zip")))
        still = still + 1 if n == packs and not compiling() else 0
        packs = n
    log(f"bytecode: {packs} packs")
    clear_venv()


def du(*paths):
    out = subprocess.run(["du", "-scb", *paths], capture_output=True, text=True,
                         check=True).stdout
    return int(out.strip().splitlines()[-1].split()[0])


def disk():
    """Bytes on disk for one environment and for ten, per tool."""
    venvs = [f"{VENV}-{i}" for i in range(10)]
    out = {}

    def clear():
        for v in venvs:
            common.unmount(v)
            shutil.rmtree(v, ignore_errors=True)
    # pip: one environment (ten are ten copies: nothing is shared).
    clear_venv()
    pip("")()
    out["pip"] = {"one": du(VENV), "ten": 10 * du(VENV)}
    clear_venv()
    # uv: its cache and the environments (du counts each hard-linked file once).
    for n in (1, 10):
        clear()
        shutil.rmtree(UV_CACHE, ignore_errors=True)
        for v in venvs[:n]:
            make_uv(v)
        out.setdefault("uv", {})["one" if n == 1 else "ten"] = du(UV_CACHE, *venvs[:n])
    clear()
    # pkgfs: the environments are mounts (nothing on disk); the index cache holds the
    # bytecode packs and the indexes, waited for after the mounts.
    for n in (1, 10):
        shutil.rmtree(INDEX_CACHE, ignore_errors=True)
        for v in venvs[:n]:
            pkgfs(at=v)()
        time.sleep(2)
        while compiling():
            time.sleep(1)
        time.sleep(2)
        out.setdefault("pkgfs", {})["one" if n == 1 else "ten"] = du(INDEX_CACHE)
        clear()
    return out


def make_uv(at):
    uvx = os.path.join(TOOLS, "bin/uv")
    env = f"UV_CACHE_DIR='{UV_CACHE}' UV_NO_CONFIG=1"
    sh(f"{env} '{uvx}' venv -q --python '{PY}' '{at}'")
    sh(f"{env} '{uvx}' pip install -q --no-deps --offline --find-links '{WHEELS}' "
       f"--python '{at}/bin/python' -r '{LOCK}'")


def main():
    make_wheels()
    wheels = len(glob.glob(os.path.join(WHEELS, "*.whl")))
    size = sum(os.path.getsize(w) for w in glob.glob(os.path.join(WHEELS, "*.whl")))
    results = {"wheels": wheels, "wheel_bytes": size, "rounds": ROUNDS, "steps": {}}
    steps = [
        ("pip", lambda: step(pip(""))),
        ("pip-nocompile", lambda: step(pip("--no-compile"))),
        ("uv-cold", lambda: (shutil.rmtree(UV_CACHE, ignore_errors=True), step(uv()))[1]),
        ("uv-warm", lambda: step(uv())),
        ("pkgfs-cold", lambda: (shutil.rmtree(INDEX_CACHE, ignore_errors=True),
                                step(pkgfs()))[1]),
        ("pkgfs-warm", lambda: step(pkgfs("--no-kept-tree"))),
        ("pkgfs-kept", lambda: step(pkgfs())),
        ("pkgfs-nocompile", lambda: step(pkgfs("--no-compile"))),
    ]
    only = common.arg(sys.argv[3:], "--only", None, str)
    for name, run in steps:
        if only and name not in only.split(","):
            continue
        if name in ("pkgfs-warm", "pkgfs-kept"):
            bytecode_made()
        if name == "pkgfs-kept":
            # Every pack there: this mount keeps its tree for the timed ones.
            clear_venv()
            pkgfs()()
            clear_venv()
        runs = [run() for _ in range(ROUNDS)]
        med = lambda i: statistics.median(r[i] for r in runs)  # noqa: E731
        results["steps"][name] = {
            "runs": runs,
            "median": statistics.median(r[0] + r[1] for r in runs),
            "make": med(0), "first_import": med(1), "second_import": med(2),
        }
        log(f"{name}: median {results['steps'][name]['median']:.2f} s")
    clear_venv()
    if not only or "disk" in only.split(","):
        results["disk"] = disk()
    with open(OUT, "w") as f:
        json.dump(results, f, indent=1)
    print(f"{wheels} wheels, {size / 1e6:.1f} MB; medians, s: made + first import "
          f"(`{IMPORT}`) = ready; second import")
    for name, r in results["steps"].items():
        print(f"  {name:16} {r['make']:.2f} + {r['first_import']:.2f} = {r['median']:.2f};"
              f" {r['second_import']:.2f}")
    for name, d in results.get("disk", {}).items():
        print(f"  disk, {name:5} one environment {d['one'] / 1e6:.1f} MB, ten {d['ten'] / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
