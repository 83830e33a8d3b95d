#!/usr/bin/env python3
"""Use a pkgfs mount of wheels as site-packages, as an interpreter would.

    import_check.py MOUNT WHEELS_DIR

Run with `python3 -I -S` (no site-packages of the machine's own, no user site): every
import and every distribution must then come from MOUNT. Checks, for each wheel in
WHEELS_DIR:
- `importlib.metadata` finds its distribution on the mount with the version the wheel's
  file name gives;
- every file its RECORD lists with a hash reads back through the mount with that hash
  (the RECORD was written by the wheel's own build tool: an independent check of the
  bytes, read the way `importlib` reads them);
and that the modules import from the mount and work, that a package's data file read by
`importlib.resources` is the wheel's member byte for byte, and that the interpreter's
attempt to write bytecode next to the sources (refused: the mount is read-only) is
silent and leaves nothing behind. Prints a summary; exits non-zero on any difference.
"""

import base64
import glob
import hashlib
import os
import sys
import zipfile

mnt, wheels = sys.argv[1], sys.argv[2]
sys.path.insert(0, mnt)

import importlib.metadata as md  # noqa: E402
import importlib.resources as res  # noqa: E402

import attr  # noqa: E402
import certifi  # noqa: E402
import idna  # noqa: E402
import packaging.version  # noqa: E402
import six  # noqa: E402

for m in (attr, certifi, idna, packaging, six):
    assert m.__file__.startswith(mnt + "/"), f"{m.__name__} imported from {m.__file__}"

checked = 0
names = []
for whl in sorted(glob.glob(os.path.join(wheels, "*.whl"))):
    name, version = os.path.basename(whl).split("-")[:2]
    names.append(name)
    dist = md.distribution(name)
    assert str(dist.locate_file("")).startswith(mnt), f"{name} found at {dist.locate_file('')}"
    assert dist.version == version, f"{name}: {dist.version} != {version}"
    with zipfile.ZipFile(whl) as z:
        members = set(z.namelist())
        for f in dist.files or []:
            if f.hash is None:
                continue
            assert f.hash.mode == "sha256", f"{name}: {f}: {f.hash.mode}"
            data = f.read_binary()
            got = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert got == f.hash.value, f"{name}: {f} reads back with a different hash"
            assert str(f) in members, f"{name}: {f} is not in the wheel"
            checked += 1
        # A data file found the way packages find theirs.
        if name == "certifi":
            pem = res.files("certifi").joinpath("cacert.pem").read_bytes()
            assert pem == z.read("certifi/cacert.pem"), "cacert.pem differs"
            assert certifi.where().startswith(mnt), certifi.where()

assert names == ["attrs", "certifi", "idna", "packaging", "six"], names
assert str(packaging.version.Version("1.0.post1")) == "1.0.post1"
assert packaging.version.Version("2.0") > packaging.version.Version("1.10")
assert idna.encode("ex\u00e4mple.com") == b"xn--exmple-cua.com"
assert six.PY3

@attr.s
class Point:
    x = attr.ib()


assert Point(1) == Point(1)
# The interpreter tried to cache bytecode beside the sources; the mount refused, silently.
for pkg in ("attr", "certifi", "idna", "packaging"):
    assert not os.path.exists(os.path.join(mnt, pkg, "__pycache__")), pkg
print(f"ok: {len(names)} distributions, {checked} files checked against their RECORD")
