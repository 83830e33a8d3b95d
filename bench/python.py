#!/usr/bin/env python3
"""A Python environment from a lock file, ready to import (issue 36), in one run:

    python.py WORKDIR OUT.json [--rounds N]

The wheels: `pip download --only-binary :all:` of a few applications and all their
dependencies (REQUIREMENTS below; about 70 wheels, numpy and pandas among them), and a
lock of them written as `pip-compile --generate-hashes` writes one (`NAME==VERSION
--hash=sha256:…`). Each step makes an environment at the same path from the same lock,
offline, and is timed until `python -c 'import pandas, jupyterlab, requests'` has run
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
                cache (every wheel read and hashed)
  pkgfs-warm    the same with the index cache of the cold run
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

WORK = os.path.join(sys.argv[1], "python")
OUT = sys.argv[2]
ROUNDS = common.arg(sys.argv[3:], "--rounds", 3)
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKGFS = os.path.join(HERE, "target/release/pkgfs")
WHEELS = os.path.join(WORK, "wheels")
LOCK = os.path.join(WORK, "requirements.txt")
VENV = os.path.join(WORK, "venv")
TOOLS = os.path.join(WORK, "tools")
UV_CACHE = os.path.join(WORK, "uv-cache")
INDEX_CACHE = os.path.join(WORK, "index-cache")
PY = subprocess.run(["python3", "-c", "import sys; print(sys.executable)"],
                    capture_output=True, text=True, check=True).stdout.strip()
REQUIREMENTS = ["pandas==2.2.3", "jupyterlab==4.2.5", "requests==2.32.3"]
IMPORT = "import pandas, jupyterlab, requests"


def make_wheels():
    if os.path.exists(LOCK):
        return
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WHEELS)
    pip = [PY, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(pip + ["download", "-q", "--only-binary", ":all:", "-d", WHEELS]
                   + REQUIREMENTS, check=True)
    lines = []
    for w in sorted(glob.glob(os.path.join(WHEELS, "*.whl"))):
        name, version = os.path.basename(w).split("-")[:2]
        digest = hashlib.sha256(open(w, "rb").read()).hexdigest()
        lines.append(f"{name}=={version} \\\n    --hash=sha256:{digest}\n")
    with open(LOCK, "w") as f:
        f.writelines(lines)
    subprocess.run([PY, "-m", "venv", TOOLS], check=True)
    subprocess.run([os.path.join(TOOLS, "bin/pip"), "install", "-q", "uv==0.9.5"], check=True)


def clear_venv():
    common.unmount(VENV)
    shutil.rmtree(VENV, ignore_errors=True)


def ready():
    subprocess.run([os.path.join(VENV, "bin/python"), "-c", IMPORT], check=True,
                   stdout=subprocess.DEVNULL)


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
    uvx = os.path.join(TOOLS, "bin/uv")

    def make():
        env = f"UV_CACHE_DIR='{UV_CACHE}' UV_NO_CONFIG=1"
        sh(f"{env} '{uvx}' venv -q --python '{PY}' '{VENV}'")
        sh(f"{env} '{uvx}' pip install -q --no-deps --offline --find-links '{WHEELS}' "
           f"--python '{VENV}/bin/python' -r '{LOCK}'")
    return make


def pkgfs():
    def make():
        os.makedirs(VENV)
        sh(f"'{PKGFS}' mount --layout python --python '{PY}' --lockfile '{LOCK}' "
           f"-o index_cache='{INDEX_CACHE}' '{WHEELS}' '{VENV}'")
    return make


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
        ("pkgfs-warm", lambda: step(pkgfs())),
    ]
    only = common.arg(sys.argv[3:], "--only", None, str)
    for name, run in steps:
        if only and name not in only.split(","):
            continue
        runs = [run() for _ in range(ROUNDS)]
        med = lambda i: statistics.median(r[i] for r in runs)  # noqa: E731
        results["steps"][name] = {
            "runs": runs,
            "median": statistics.median(r[0] + r[1] for r in runs),
            "make": med(0), "first_import": med(1), "second_import": med(2),
        }
        log(f"{name}: median {results['steps'][name]['median']:.2f} s")
    clear_venv()
    with open(OUT, "w") as f:
        json.dump(results, f, indent=1)
    print(f"{wheels} wheels, {size / 1e6:.1f} MB; medians, s: made + first import "
          f"(`{IMPORT}`) = ready; second import")
    for name, r in results["steps"].items():
        print(f"  {name:14} {r['make']:.2f} + {r['first_import']:.2f} = {r['median']:.2f};"
              f" {r['second_import']:.2f}")


if __name__ == "__main__":
    main()
