#!/usr/bin/env python3
"""Compare two directory trees byte for byte and attribute by attribute.

    treecmp.py EXPECTED ACTUAL [--no-owner] [--no-dir-mtime] [--no-xattrs]

Compares the set of paths, file type, permission bits (including setuid/setgid/sticky),
size, mtime (whole seconds), uid/gid, symlink targets, file content (sha256), device
numbers, extended attributes (names and values; `--no-xattrs` skips them), and hard
links: names that share an inode in EXPECTED must share one in ACTUAL, with the same
link count. Exit 0 if equal; else prints the differences (at most 50) and exits 1.
Used to check `pkgfs pack` round trips: the source tree against the mounted package and
against `zstd -dc | tar x`.
"""

import hashlib
import os
import stat
import sys


def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def scan(root):
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
            if stat.S_ISREG(st.st_mode):
                node.update(size=st.st_size, digest=digest(full))
            elif stat.S_ISLNK(st.st_mode):
                node.update(target=os.readlink(full))
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                node.update(rdev=(os.major(st.st_rdev), os.minor(st.st_rdev)))
            try:
                names = os.listxattr(full, follow_symlinks=False)
            except OSError:
                names = []
            node.update(xattrs={n: os.getxattr(full, n, follow_symlinks=False)
                                for n in sorted(names)})
            out[rel] = node
    return out


def link_groups(tree):
    groups = {}
    for path, n in tree.items():
        if n["type"] == stat.S_IFREG and n["nlink"] > 1:
            groups.setdefault(n["ino"], []).append(path)
    return sorted(sorted(g) for g in groups.values())


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    want, got = scan(argv[0]), scan(argv[1])
    keys = ["type", "mode", "uid", "gid", "mtime", "size", "digest", "target", "rdev", "xattrs"]
    if "--no-xattrs" in argv:
        keys.remove("xattrs")
    if "--no-owner" in argv:
        keys.remove("uid")
        keys.remove("gid")
    problems = []
    show = lambda p: p.decode(errors="replace")
    for p in sorted(set(want) - set(got)):
        problems.append(f"missing: {show(p)}")
    for p in sorted(set(got) - set(want)):
        problems.append(f"unexpected: {show(p)}")
    for p in sorted(set(want) & set(got)):
        w, g = want[p], got[p]
        for k in keys:
            if k == "mtime" and w["type"] == stat.S_IFDIR and "--no-dir-mtime" in argv:
                continue
            if w.get(k) != g.get(k):
                problems.append(f"{show(p)}: {k} is {g.get(k)!r}, expected {w.get(k)!r}")
    if link_groups(want) != link_groups(got):
        problems.append(f"hard links differ: expected {link_groups(want)}, got {link_groups(got)}")
    for line in problems[:50]:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
