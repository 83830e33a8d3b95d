#!/usr/bin/env python3
"""Compare two trees as mount-tests/treecmp.py does, with what a layout's reference
tree legitimately differs in left out.

    cmp.py EXPECTED ACTUAL [--no-mtime] [--no-dir-mtime] [--no-owner] [--exclude REL]...
           [--ignore REL]...

`--no-mtime`: npm writes every file at the time of the install, pkgfs keeps the
tarball's times. `--exclude REL` leaves out the path REL of EXPECTED (relative, e.g.
`.package-lock.json`, npm's own bookkeeping) and everything under it; ACTUAL must not
have it at all. `--ignore REL` leaves REL out of both trees (its attributes are checked
elsewhere). Everything else (paths, type, permission bits, size, content, symlink
targets, owner unless `--no-owner`, xattrs, hard link groups) must be equal. Exit 0 if
equal; else prints the differences (at most 50) and exits 1.
"""

import os
import stat
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import treecmp  # noqa: E402


def main(argv):
    args, excluded, ignored = [], [], []
    it = iter(argv)
    for a in it:
        if a == "--exclude":
            excluded.append(os.fsencode(next(it)))
        elif a == "--ignore":
            ignored.append(os.fsencode(next(it)))
        else:
            args.append(a)
    flags = {a for a in args if a.startswith("--")}
    paths = [a for a in args if not a.startswith("--")]
    if len(paths) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    want, got = treecmp.scan(paths[0]), treecmp.scan(paths[1])
    problems = []
    show = lambda p: p.decode(errors="replace")

    def under(p, roots):
        return any(p == e or p.startswith(e + b"/") for e in roots)

    for p in sorted(p for p in got if under(p, excluded)):
        problems.append(f"present but should not be: {show(p)}")
    want = {p: n for p, n in want.items() if not under(p, excluded + ignored)}
    got = {p: n for p, n in got.items() if not under(p, excluded + ignored)}
    keys = ["type", "mode", "uid", "gid", "mtime", "size", "digest", "target", "rdev", "xattrs"]
    if "--no-mtime" in flags:
        keys.remove("mtime")
    if "--no-owner" in flags:
        keys.remove("uid")
        keys.remove("gid")
    for p in sorted(set(want) - set(got)):
        problems.append(f"missing: {show(p)}")
    for p in sorted(set(got) - set(want)):
        problems.append(f"unexpected: {show(p)}")
    for p in sorted(set(want) & set(got)):
        w, g = want[p], got[p]
        for k in keys:
            if k == "mtime" and w["type"] == stat.S_IFDIR and "--no-dir-mtime" in flags:
                continue
            if w.get(k) != g.get(k):
                problems.append(f"{show(p)}: {k} is {g.get(k)!r}, expected {w.get(k)!r}")
    if treecmp.link_groups(want) != treecmp.link_groups(got):
        problems.append("hard links differ: expected "
                        f"{treecmp.link_groups(want)}, got {treecmp.link_groups(got)}")
    for line in problems[:50]:
        print(line)
    if len(problems) > 50:
        print(f"... and {len(problems) - 50} more")
    print(f"{len(want)} paths compared", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
