#!/usr/bin/env python3
"""Compare two directory trees byte for byte and attribute by attribute.

    treecmp.py EXPECTED ACTUAL [--no-owner] [--no-mtime] [--no-dir-mtime] [--no-xattrs]
               [--pyc] [--exclude REL]... [--ignore REL]...

Compares the set of paths, file type, permission bits (including setuid/setgid/sticky),
size, mtime (whole seconds), uid/gid, symlink targets, file content (sha256), device
numbers, extended attributes (names and values; `--no-xattrs` skips them), and hard
links: names that share an inode in EXPECTED must share one in ACTUAL, with the same
link count. Exit 0 if equal; else prints the differences (at most 50) and exits 1.
`--no-mtime` skips modification times (npm writes every file at the time of the
install; pkgfs keeps the tarball's). `--exclude REL` leaves out the path REL of EXPECTED
and everything under it, and ACTUAL must not have it at all (npm's own bookkeeping file
`.package-lock.json`); `--ignore REL` leaves REL out of both trees (checked elsewhere).
`--pyc`: a timestamp-checked `__pycache__/NAME.TAG.pyc` is compared with its source
time field (bytes 8-12 of the header) left out, and in ACTUAL that field and the size
field must be its source's (`../NAME.py`) as ACTUAL serves it (the interpreter would
use it); the same bytes otherwise (code, source size, flags, magic number), once
marshal's interning flags are made alike (they follow the state of the process that
compiled: both loaded, then written again, in this one).
Used to check `pkgfs pack` round trips (the source tree against the mounted package and
against `zstd -dc | tar x`) and layouts against `npm ci`, cargo's unpacking and `tar -x`.
"""

import errno
import hashlib
import os
import stat
import sys

# What listxattr may answer for "this file has no extended attributes" (a filesystem
# without them); any other error (EIO above all) is a failure, not an empty list.
NO_XATTRS = {errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENODATA, errno.ENOSYS}


def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def xattrs_of(full):
    try:
        names = os.listxattr(full, follow_symlinks=False)
    except OSError as e:
        if e.errno in NO_XATTRS:
            return {}
        sys.exit(f"treecmp.py: listxattr {os.fsdecode(full)}: {e}")
    return {n: os.getxattr(full, n, follow_symlinks=False) for n in sorted(names)}


def pyc_of(full, data):
    """A pyc's content with its source time left out, and whether its header's time and
    size are its source's."""
    if len(data) < 16 or int.from_bytes(data[4:8], "little") != 0:
        return data, True  # not timestamp-checked: compared whole
    top, name = os.path.split(full)
    src = os.path.join(os.path.dirname(top), name.rsplit(b".", 2)[0] + b".py")
    try:
        st = os.stat(src)
    except OSError:
        return data, False
    fresh = (int.from_bytes(data[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
             and int.from_bytes(data[12:16], "little") == st.st_size & 0xFFFFFFFF)
    return data[:8] + bytes(4) + data[12:], fresh


def same_code(a, b):
    """Whether two pycs (source time left out) hold the same code, marshal's interning
    flags aside."""
    import marshal
    if a[:16] != b[:16]:
        return False
    try:
        x, y = marshal.loads(a[16:]), marshal.loads(b[16:])
    except Exception:
        return False
    return marshal.dumps(x) == marshal.dumps(y)


def scan(root, xattrs=True, pyc=False):
    out = {}
    root = os.fsencode(root)
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(top, name)
            st = os.lstat(full)
            rel = os.path.relpath(full, root)
            node = dict(type=stat.S_IFMT(st.st_mode), mode=st.st_mode & 0o7777,
                        uid=st.st_uid, gid=st.st_gid, mtime=int(st.st_mtime), ino=st.st_ino,
                        nlink=st.st_nlink)
            if stat.S_ISREG(st.st_mode) and pyc and name.endswith(b".pyc") \
                    and os.path.basename(top) == b"__pycache__":
                with open(full, "rb") as f:
                    data, fresh = pyc_of(full, f.read())
                node.update(size=st.st_size, digest=hashlib.sha256(data).hexdigest(),
                            fresh=fresh, pyc=data)
            elif stat.S_ISREG(st.st_mode):
                node.update(size=st.st_size, digest=digest(full))
            elif stat.S_ISLNK(st.st_mode):
                node.update(target=os.readlink(full))
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                node.update(rdev=(os.major(st.st_rdev), os.minor(st.st_rdev)))
            if xattrs:
                node.update(xattrs=xattrs_of(full))
            out[rel] = node
    return out


def link_groups(tree):
    groups = {}
    for path, n in tree.items():
        if n["type"] == stat.S_IFREG and n["nlink"] > 1:
            groups.setdefault(n["ino"], []).append(path)
    return sorted(sorted(g) for g in groups.values())


def under(p, roots):
    return any(p == r or p.startswith(r + b"/") for r in roots)


def main(argv):
    flags, paths, excluded, ignored = set(), [], [], []
    it = iter(argv)
    for a in it:
        if a == "--exclude":
            excluded.append(os.fsencode(next(it)))
        elif a == "--ignore":
            ignored.append(os.fsencode(next(it)))
        elif a.startswith("--"):
            flags.add(a)
        else:
            paths.append(a)
    if len(paths) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    xattrs = "--no-xattrs" not in flags
    pyc = "--pyc" in flags
    want, got = scan(paths[0], xattrs, pyc), scan(paths[1], xattrs, pyc)
    problems = []
    show = lambda p: p.decode(errors="replace")
    for p in sorted(p for p in got if under(p, excluded)):
        problems.append(f"present but should not be: {show(p)}")
    want = {p: n for p, n in want.items() if not under(p, excluded + ignored)}
    got = {p: n for p, n in got.items() if not under(p, excluded + ignored)}
    keys = ["type", "mode", "uid", "gid", "mtime", "size", "digest", "target", "rdev", "xattrs"]
    for flag, dropped in [("--no-xattrs", ["xattrs"]), ("--no-owner", ["uid", "gid"]),
                          ("--no-mtime", ["mtime"])]:
        if flag in flags:
            for k in dropped:
                keys.remove(k)
    for p in sorted(set(want) - set(got)):
        problems.append(f"missing: {show(p)}")
    for p in sorted(set(got) - set(want)):
        problems.append(f"unexpected: {show(p)}")
    for p in sorted(p for p, n in got.items() if n.get("fresh") is False):
        problems.append(f"{show(p)}: its header does not match its source's time and size")
    for p in sorted(set(want) & set(got)):
        w, g = want[p], got[p]
        for k in keys:
            if k == "mtime" and w["type"] == stat.S_IFDIR and "--no-dir-mtime" in flags:
                continue
            if k == "digest" and "pyc" in w and "pyc" in g and same_code(w["pyc"], g["pyc"]):
                continue
            if w.get(k) != g.get(k):
                problems.append(f"{show(p)}: {k} is {g.get(k)!r}, expected {w.get(k)!r}")
    if link_groups(want) != link_groups(got):
        problems.append(f"hard links differ: expected {link_groups(want)}, got {link_groups(got)}")
    for line in problems[:50]:
        print(line)
    if len(problems) > 50:
        print(f"... and {len(problems) - 50} more")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
