#!/usr/bin/env python3
"""An independent check of a store's seal, by docs/FORMAT.md "Seals" alone.

    seal_check.py STORE     exit 0 (printing "ok N archives") if the seal is right

Recomputes with Python's hashlib, sharing no code with pkgfs: the header of
`pkgfs.seal`; per archive, its size, the sha256 of its bytes and its tree root
(sha256 of "pkgfs-tree 1\\0", the block size and the size as big-endian u64, and the
sha256 of each block); `pkgfs.seal.d/ROOT` holding the leaves of each archive of two
blocks or more; the listed names being the store's archives (its
regular files less hidden ones and the seal's own), sorted. The signature is
`ssh-keygen -Y verify`'s to check.
"""

import hashlib
import os
import struct
import sys


def fail(msg):
    print(f"seal_check: {msg}")
    sys.exit(1)


def leaves_of(path, block):
    out, whole = [], hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(block)
            if not chunk:
                break
            whole.update(chunk)
            out.append(hashlib.sha256(chunk).digest())
    return out, whole.hexdigest()


def main(store):
    with open(os.path.join(store, "pkgfs.seal"), "rb") as f:
        text = f.read().decode("utf-8")
    if not text.endswith("\n"):
        fail("no final newline")
    lines = text[:-1].split("\n")
    if lines[0] != "pkgfs-seal 1":
        fail(f"first line {lines[0]!r}")
    header = {}
    for line, key in zip(lines[1:4], ["revision", "block-size", "archives"]):
        k, _, v = line.partition(" ")
        if k != key or not v.isdigit():
            fail(f"expected `{key} N`, found {line!r}")
        header[key] = int(v)
    block = header["block-size"]
    if block & (block - 1) or not 4096 <= block <= 16 << 20:
        fail(f"block size {block}")
    rows = lines[4:]
    if len(rows) != header["archives"]:
        fail(f"says {header['archives']} archives, lists {len(rows)}")
    names = [r.split(" ", 3)[3] for r in rows]
    if names != sorted(names, key=lambda n: n.encode()):
        fail("lines not sorted by name")
    archives = sorted(
        n for n in os.listdir(store)
        if not n.startswith(".") and not n.startswith("pkgfs.seal")
        and os.path.isfile(os.path.join(store, n))
    )
    if sorted(names) != archives:
        fail(f"lists {sorted(names)}, the store holds {archives}")
    trees = set()
    for r in rows:
        size, sha, tree, name = r.split(" ", 3)
        path = os.path.join(store, name)
        leaves, whole = leaves_of(path, block)
        if int(size) != os.path.getsize(path):
            fail(f"{name}: size {size}, the file has {os.path.getsize(path)}")
        if sha != whole:
            fail(f"{name}: sha256 {sha}, hashlib says {whole}")
        root = hashlib.sha256(
            b"pkgfs-tree 1\0" + struct.pack(">QQ", block, int(size)) + b"".join(leaves)
        ).hexdigest()
        if tree != root:
            fail(f"{name}: tree root {tree}, hashlib says {root}")
        if len(leaves) > 1:
            with open(os.path.join(store, "pkgfs.seal.d", tree), "rb") as f:
                if f.read() != b"".join(leaves):
                    fail(f"{name}: pkgfs.seal.d/{tree} is not its leaves")
            trees.add(tree)
    d = os.path.join(store, "pkgfs.seal.d")
    have = set(os.listdir(d)) if os.path.isdir(d) else set()
    # Trees of earlier seals may stay (mounts of the older seal still read them).
    if trees - have:
        fail(f"pkgfs.seal.d lacks {sorted(trees - have)}")
    print(f"ok {len(rows)} archives, {len(trees)} trees")


if __name__ == "__main__":
    main(sys.argv[1])
