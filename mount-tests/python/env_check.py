#!/usr/bin/env python3
"""What an environment does with the projects installed in SITE (its own or another's):

    env_check.py imports SITE              every top-level module and package the RECORDs
                                           of SITE list, imported in this interpreter:
                                           {name: "ok" or the exception's class}
    env_check.py launchers SITE BIN REF    each console and GUI entry point of SITE with
                                           --version: from BIN's launcher, and through
                                           the REF interpreter as the launcher would call
                                           it; {name: [[exit, traceback?] from BIN,
                                           [exit, traceback?] from REF]} (their output
                                           may name paths and sys.path, which differ)

JSON on standard output. Used by mount-tests/python.rs to compare a pkgfs environment
with pip's install of the same lock.
"""

import configparser
import importlib
import json
import os
import subprocess
import sys


def dist_infos(site):
    return sorted(d for d in os.listdir(site) if d.endswith(".dist-info"))


def top_level(site):
    names = set()
    for d in dist_infos(site):
        with open(os.path.join(site, d, "RECORD"), newline="") as f:
            for line in f:
                path = line.rsplit(",", 2)[0]
                top = path.split("/")[0]
                if top.startswith("..") or top.endswith((".dist-info", ".data")):
                    continue
                if "/" in path:
                    name = top
                elif top.endswith(".py"):
                    name = top[:-3]
                elif top.endswith(".so"):
                    name = top.split(".")[0]
                else:
                    continue
                if name.isidentifier() and name != "__pycache__":
                    names.add(name)
    return sorted(names)


def imports(site):
    out = {}
    for name in top_level(site):
        try:
            importlib.import_module(name)
            out[name] = "ok"
        except BaseException as e:  # noqa: BLE001 - the class is the result
            out[name] = type(e).__name__
    return out


def entry_points(site):
    for d in dist_infos(site):
        p = os.path.join(site, d, "entry_points.txt")
        if not os.path.exists(p):
            continue
        c = configparser.ConfigParser(delimiters=("=",))
        c.optionxform = str
        c.read(p)
        for group in ("console_scripts", "gui_scripts"):
            if c.has_section(group):
                for name, value in c.items(group):
                    yield name, value.split("[")[0].strip()


CALL = """import importlib, sys
mod, _, attr = sys.argv.pop(1).partition(":")
sys.argv[0] = sys.argv.pop(1)
obj = importlib.import_module(mod)
for a in attr.split("."):
    obj = getattr(obj, a)
sys.exit(obj())
"""


def launchers(site, bindir, ref):
    out = {}
    for name, target in entry_points(site):
        runs = []
        for cmd in ([os.path.join(bindir, name), "--version"],
                    [ref, "-c", CALL, target, os.path.join(bindir, name), "--version"]):
            try:
                r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                                   text=True, timeout=120)
                runs.append([r.returncode, "Traceback" in r.stderr])
            except subprocess.TimeoutExpired:
                runs.append(["timeout", False])
        out[name] = runs
    return out


if __name__ == "__main__":
    if sys.argv[1] == "imports":
        print(json.dumps(imports(sys.argv[2])))
    else:
        print(json.dumps(launchers(sys.argv[2], sys.argv[3], sys.argv[4])))
