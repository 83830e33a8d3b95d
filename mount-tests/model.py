#!/usr/bin/env python3
"""An independent model of what a pkgfs mount must show, and a checker.

The model is built from the archives alone with Python's `zipfile` and shares no code
with pkgfs: if the two implementations of docs/SEMANTICS.md disagree, a test fails.

    model.py compare [--unzip-check] MOUNTPOINT SOURCE...   exit 0 if the mount matches
    model.py manifest SOURCE...                             the model as JSON

SOURCEs are given exactly as to `pkgfs mount`. `--unzip-check` additionally extracts
every layer in order with Info-ZIP `unzip -o` and compares that tree (content, symlink
targets, file mtimes, the set of paths) with the mount; it is only meaningful for sets
without file/directory clashes, unsafe names or corrupt members.

Members that zipfile cannot decode because they are corrupt, encrypted or use a method
pkgfs does not support must read as EIO. zstd members (method 93) are not supported by
this Python's zipfile; their content is decoded with the `zstd` command instead.
"""

import hashlib
import json
import os
import stat
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib

SUPPORTED = {0, 8, 93}


def layers(sources):
    """The archives of SOURCES in layer order (see docs/SEMANTICS.md)."""
    out = []
    for src in sources:
        if os.path.isdir(src):
            names = sorted(os.listdir(os.fsencode(src)))
            for n in names:
                p = os.path.join(os.fsencode(src), n)
                if n.startswith(b".") or not os.path.isfile(p):
                    continue
                out.append(os.fsdecode(p))
        else:
            out.append(src)
    good = []
    for p in out:
        try:
            with zipfile.ZipFile(p) as zf:
                zf.infolist()
            good.append(p)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError):
            pass
    return good


def extra_fields(extra):
    i = 0
    while i + 4 <= len(extra):
        fid, ln = struct.unpack_from("<HH", extra, i)
        if i + 4 + ln > len(extra):
            return
        yield fid, extra[i + 4:i + 4 + ln]
        i += 4 + ln


def normalise(raw):
    """Components of a stored name, or None if pkgfs must skip the entry."""
    if b"\0" in raw or raw[:1] in (b"/", b"\\"):
        return None
    comps = []
    for i, c in enumerate(raw.replace(b"\\", b"/").split(b"/")):
        if c in (b"", b"."):
            continue
        if c == b".." or len(c) > 255:
            return None
        if i == 0 and len(c) == 2 and c[1:] == b":" and chr(c[0]).isalpha():
            return None
        comps.append(c)
    return comps


def entry_attrs(info):
    """(kind, perm, mtime, uid, gid) of a central-directory entry; kind None = skip."""
    raw = info.orig_filename
    mode = info.external_attr >> 16 if info.create_system in (3, 19) else 0
    slash = raw.endswith("/") or raw.endswith("\\")
    t = stat.S_IFMT(mode)
    if t == stat.S_IFDIR:
        kind = "dir"
    elif t == stat.S_IFLNK:
        kind = "symlink"
    elif t == stat.S_IFREG:
        kind = "dir" if slash else "file"
    elif t == 0:
        kind = "dir" if slash or info.external_attr & 0x10 else "file"
    else:
        kind = None
    if mode:
        perm = mode & 0o7777
    elif kind == "dir":
        perm = 0o755
    else:
        perm = 0o444 if info.external_attr & 1 else 0o644
    if kind == "symlink":
        perm = 0o777
    mtime = ntfs = uid = gid = None
    for fid, data in extra_fields(info.extra):
        if fid == 0x5455 and len(data) >= 5 and data[0] & 1:
            mtime = struct.unpack_from("<I", data, 1)[0]
        elif fid == 0x000A and len(data) >= 4 + 4 + 8:
            j = 4
            while j + 4 <= len(data):
                tag, ln = struct.unpack_from("<HH", data, j)
                if tag == 1 and ln >= 8:
                    ft = struct.unpack_from("<Q", data, j + 4)[0]
                    ntfs = (ft - 116444736000000000) // 10**7
                    break
                j += 4 + ln
        elif fid == 0x7875 and len(data) >= 3 and data[0] == 1:
            n = data[1]
            u = int.from_bytes(data[2:2 + n], "little")
            m = data[2 + n]
            g = int.from_bytes(data[3 + n:3 + n + m], "little")
            uid, gid = u, g
    if mtime is None:
        mtime = ntfs
    if mtime is None:
        y, mo, d, h, mi, s = info.date_time
        mtime = int(time.mktime((y, mo, d, h, mi, s, 0, 0, -1)))
    return kind, perm, mtime, uid, gid


def raw_name(info):
    name = info.orig_filename
    if info.flag_bits & 0x800:
        return name.encode("utf-8")
    return name.encode("cp437")


def member_digest(zf, path, info):
    """sha256 hex of a member's data, or "EIO" if pkgfs must refuse to read it."""
    if info.compress_type not in SUPPORTED or info.flag_bits & 1:
        return "EIO", None
    if info.compress_type == 93:
        return zstd_digest(path, info)
    h = hashlib.sha256()
    first = b""
    try:
        with zf.open(info) as f:
            while True:
                chunk = f.read(1 << 22)
                if not chunk:
                    break
                if len(first) < 4096:
                    first += chunk[:4096]
                h.update(chunk)
    except (zipfile.BadZipFile, zlib.error, EOFError, RuntimeError, NotImplementedError):
        return "EIO", None
    return h.hexdigest(), first


def zstd_digest(path, info):
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        lfh = f.read(30)
        n, m = struct.unpack_from("<HH", lfh, 26)
        f.seek(info.header_offset + 30 + n + m)
        comp = f.read(info.compress_size)
    r = subprocess.run(["zstd", "-dc"], input=comp, capture_output=True)
    if r.returncode != 0 or zlib.crc32(r.stdout) != info.CRC or len(r.stdout) != info.file_size:
        return "EIO", None
    return hashlib.sha256(r.stdout).hexdigest(), r.stdout[:4096]


def build_model(sources):
    """path bytes (b"" = root) -> attribute dict, following docs/SEMANTICS.md."""
    me_uid, me_gid = os.getuid(), os.getgid()
    arch = layers(sources)
    root_mtime = max((int(os.stat(p).st_mtime) for p in arch), default=0)
    tree = {b"": dict(kind="dir", perm=0o755, mtime=root_mtime, uid=me_uid, gid=me_gid, explicit=False)}

    def drop_subtree(path):
        for k in [k for k in tree if k == path or k.startswith(path + b"/")]:
            del tree[k]

    for p in arch:
        amtime = int(os.stat(p).st_mtime)
        with zipfile.ZipFile(p) as zf:
            for info in zf.infolist():
                comps = normalise(raw_name(info))
                kind, perm, mtime, uid, gid = entry_attrs(info)
                if comps is None or kind is None:
                    continue
                # Parents: implied directories; a directory beats a file.
                for i in range(1, len(comps)):
                    parent = b"/".join(comps[:i])
                    node = tree.get(parent)
                    if node is None or node["kind"] != "dir":
                        tree[parent] = dict(kind="dir", perm=0o755, mtime=amtime, uid=me_uid,
                                            gid=me_gid, explicit=False)
                    elif not node["explicit"]:
                        node["mtime"] = amtime
                path = b"/".join(comps)
                new = dict(kind=kind, perm=perm, mtime=mtime,
                           uid=me_uid if uid is None else uid,
                           gid=me_gid if gid is None else gid, explicit=True)
                old = tree.get(path)
                if kind == "dir":
                    if old is not None and old["kind"] != "dir":
                        drop_subtree(path)
                    tree[path] = new
                    continue
                if old is not None and old["kind"] == "dir":
                    continue  # a directory beats a file, whichever came first
                digest, first = member_digest(zf, p, info)
                new.update(size=info.file_size, digest=digest)
                if kind == "symlink":
                    new["target"] = None if digest == "EIO" else first.decode("latin-1")
                tree[path] = new
    for path, node in tree.items():
        if node["kind"] == "dir":
            prefix = path + b"/" if path else b""
            node["nlink"] = 2 + sum(
                1 for k, v in tree.items()
                if v["kind"] == "dir" and k and k.startswith(prefix) and b"/" not in k[len(prefix):]
            )
    return tree


def observe(mount):
    """The mounted tree: path bytes -> attribute dict, and readdir order problems."""
    seen = {}
    problems = []
    stack = [b""]
    mount = os.fsencode(mount)
    while stack:
        rel = stack.pop()
        full = os.path.join(mount, rel) if rel else mount
        names = os.listdir(full)
        if names != sorted(names):
            problems.append(f"readdir order of /{rel.decode(errors='replace')} is not byte order")
        for n in names:
            r = rel + b"/" + n if rel else n
            st = os.lstat(os.path.join(mount, r))
            node = dict(perm=st.st_mode & 0o7777, mtime=int(st.st_mtime), uid=st.st_uid,
                        gid=st.st_gid, size=st.st_size, nlink=st.st_nlink, ino=st.st_ino)
            if stat.S_ISDIR(st.st_mode):
                node["kind"] = "dir"
                stack.append(r)
            elif stat.S_ISLNK(st.st_mode):
                node["kind"] = "symlink"
                try:
                    node["target"] = os.readlink(os.path.join(mount, r)).decode("latin-1")
                except OSError as e:
                    node["target"] = None if e.errno == 5 else f"errno {e.errno}"
            else:
                node["kind"] = "file"
                node["digest"] = read_digest(os.path.join(mount, r))
            seen[r] = node
    inodes = {}
    for path, node in seen.items():
        inodes.setdefault(node["ino"], []).append(path)
    for ino, paths in inodes.items():
        if len(paths) > 1:
            problems.append(f"inode {ino} is shared by {len(paths)} paths, e.g. {paths[:2]}")
    st = os.lstat(mount)
    seen[b""] = dict(kind="dir", perm=st.st_mode & 0o7777, mtime=int(st.st_mtime), uid=st.st_uid,
                     gid=st.st_gid, nlink=st.st_nlink)
    return seen, problems


def read_digest(path):
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while True:
                chunk = f.read(1 << 22)
                if not chunk:
                    return h.hexdigest()
                h.update(chunk)
    except OSError as e:
        return "EIO" if e.errno == 5 else f"errno {e.errno}"


def compare(mount, sources):
    want = build_model(sources)
    got, problems = observe(mount)
    show = lambda p: "/" + p.decode(errors="replace")
    for p in sorted(set(want) - set(got)):
        problems.append(f"missing: {show(p)}")
    for p in sorted(set(got) - set(want)):
        problems.append(f"unexpected: {show(p)}")
    for p in sorted(set(want) & set(got)):
        w, g = want[p], got[p]
        keys = ["kind", "perm", "mtime", "uid", "gid"]
        if w["kind"] == "dir":
            keys.append("nlink")
        else:
            keys += ["size", "digest"] if w["kind"] == "file" else ["size", "target"]
        for k in keys:
            if k in w and w.get(k) != g.get(k):
                problems.append(f"{show(p)}: {k} is {g.get(k)!r}, expected {w.get(k)!r}")
    return problems


def unzip_check(mount, sources):
    problems = []
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, TZ="UTC")
        for p in layers(sources):
            subprocess.run(["unzip", "-o", "-q", p, "-d", d], check=True, env=env)
        ref = {}
        for top, dirs, files in os.walk(os.fsencode(d)):
            for n in dirs + files:
                full = os.path.join(top, n)
                ref[os.path.relpath(full, os.fsencode(d))] = full
        got, _ = observe(mount)
        got.pop(b"")
        if set(ref) != set(got):
            for p in sorted(set(ref) ^ set(got))[:20]:
                problems.append(f"unzip/mount path sets differ at /{p.decode(errors='replace')}")
        for rel, full in sorted(ref.items()):
            g = got.get(rel)
            if g is None:
                continue
            st = os.lstat(full)
            where = "/" + rel.decode(errors="replace")
            if stat.S_ISLNK(st.st_mode):
                if os.readlink(full).decode("latin-1") != g.get("target"):
                    problems.append(f"{where}: symlink target differs from unzip")
            elif stat.S_ISREG(st.st_mode):
                if read_digest(full) != g.get("digest"):
                    problems.append(f"{where}: content differs from unzip")
                if int(st.st_mtime) != g["mtime"]:
                    problems.append(f"{where}: mtime {g['mtime']} but unzip set {int(st.st_mtime)}")
    return problems


def main(argv):
    if len(argv) >= 2 and argv[0] == "manifest":
        model = build_model(argv[1:])
        json.dump({("/" + k.decode(errors="replace")): v for k, v in sorted(model.items())},
                  sys.stdout, indent=1, default=str)
        print()
        return 0
    if len(argv) >= 3 and argv[0] == "compare":
        args = argv[1:]
        unzip = args[0] == "--unzip-check"
        if unzip:
            args = args[1:]
        mount, sources = args[0], args[1:]
        problems = unzip_check(mount, sources) if unzip else compare(mount, sources)
        for line in problems[:50]:
            print(line)
        if len(problems) > 50:
            print(f"... and {len(problems) - 50} more")
        return 1 if problems else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
