#!/usr/bin/env python3
"""Hand-made hostile OCI image layouts, one per directory, each wrong in one way only.

    hostile.py OUTDIR

Every case is an OCI image layout (oci-layout, index.json, blobs/sha256/) whose index
has one manifest tagged `latest`; apart from its one flaw, each is valid (config
diff_ids, sizes and digests all agree). OUTDIR/cases.json lists the cases with what a
careful reader should do. Standard library only; deterministic output (fixed mtimes,
gzip without timestamps).

  missing-blob       the manifest names a layer blob that is not in blobs/
  missing-manifest   index.json names a manifest blob that is not in blobs/
  digest-mismatch    a layer whose content does not hash to its digest (same size)
  size-mismatch      a layer descriptor whose size is one byte short
  bad-json           the manifest blob is not JSON
  unsafe-paths       entries `../x`, `/abs`, `a/../../x`, hard links to `../..` and
                     `/etc/passwd`; a second layer whites out `..` and the empty name
  symlink-escape     symlinks to `/../../etc/passwd`, `../../../etc`, `../../../tmp`; a
                     second layer writes a file and a hard link through them
  huge-manifest      a 50 MiB manifest (one annotation of 50 MiB)
  many-layers        a manifest of 100,000 layers (one small blob, repeated)
  nested-index       index.json -> 1,000 nested image indexes -> the manifest
  truncated-gzip     a layer whose gzip stream stops half way (its digest matches)
  gzip-bomb          a 1 MiB layer holding a 1 GiB file of zeros
"""

import gzip
import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import zlib

MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
MTIME = 1700000000
REF = "org.opencontainers.image.ref.name"


def sha(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tar(entries):
    """entries: (name, kind, payload) with kind file|dir|symlink|hardlink."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, kind, payload in entries:
            ti = tarfile.TarInfo(name)
            ti.mtime = MTIME
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            if kind == "file":
                data = payload if isinstance(payload, bytes) else payload.encode()
                ti.size, ti.mode = len(data), 0o644
                t.addfile(ti, io.BytesIO(data))
                continue
            if kind == "dir":
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            elif kind == "symlink":
                ti.type, ti.mode, ti.linkname = tarfile.SYMTYPE, 0o777, payload
            elif kind == "hardlink":
                ti.type, ti.mode, ti.linkname = tarfile.LNKTYPE, 0o644, payload
            t.addfile(ti)
    return buf.getvalue()


def gz(data, level=9):
    return gzip.compress(data, compresslevel=level, mtime=0)


class Layout:
    def __init__(self, root):
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(os.path.join(root, "blobs", "sha256"))
        self.root = root
        with open(os.path.join(root, "oci-layout"), "w") as f:
            f.write('{"imageLayoutVersion":"1.0.0"}')

    def path(self, digest):
        return os.path.join(self.root, "blobs", "sha256", digest.split(":", 1)[1])

    def blob(self, data, media_type):
        digest = sha(data)
        with open(self.path(digest), "wb") as f:
            f.write(data)
        return dict(mediaType=media_type, digest=digest, size=len(data))

    def json_blob(self, obj, media_type):
        return self.blob(json.dumps(obj, separators=(",", ":")).encode(), media_type)

    def config(self, diff_ids):
        return self.json_blob(dict(
            architecture="amd64", os="linux", created="2023-11-14T22:13:20Z",
            config=dict(Cmd=["/bin/sh"]), rootfs=dict(type="layers", diff_ids=diff_ids)), MT_CONFIG)

    def manifest(self, config, layers, annotations=None):
        m = dict(schemaVersion=2, mediaType=MT_MANIFEST, config=config, layers=layers)
        if annotations:
            m["annotations"] = annotations
        return self.json_blob(m, MT_MANIFEST)

    def image(self, tars, annotations=None):
        """A manifest for gzip layers made from tar bytes; returns its descriptor."""
        layers = [self.blob(gz(t), MT_GZIP) for t in tars]
        return self.manifest(self.config([sha(t) for t in tars]), layers, annotations)

    def index(self, desc):
        desc = dict(desc, annotations={REF: "latest"})
        with open(os.path.join(self.root, "index.json"), "w") as f:
            json.dump(dict(schemaVersion=2, mediaType=MT_INDEX, manifests=[desc]), f)


def plain_tar():
    return tar([("etc/", "dir", None), ("etc/hostname", "file", "hostile\n"),
                ("hello.txt", "file", "hello from a hostile fixture\n")])


def case_missing_blob(root):
    lay = Layout(root)
    t = plain_tar()
    m = lay.image([t])
    layer = json.load(open(lay.path(m["digest"])))["layers"][0]
    os.remove(lay.path(layer["digest"]))
    lay.index(m)
    return f"layer blob {layer['digest']} is absent", "refuse the image (or that layer) with an error naming the digest"


def case_missing_manifest(root):
    lay = Layout(root)
    m = lay.image([plain_tar()])
    os.remove(lay.path(m["digest"]))
    lay.index(m)
    return f"manifest blob {m['digest']} is absent", "refuse with an error"


def case_digest_mismatch(root):
    lay = Layout(root)
    good = tar([("file.txt", "file", "the declared content\n")])
    evil = tar([("file.txt", "file", "the swapped  content\n")])
    assert len(good) == len(evil)
    g, e = gz(good, 0), gz(evil, 0)  # stored deflate blocks: equal sizes
    assert len(g) == len(e)
    desc = dict(mediaType=MT_GZIP, digest=sha(g), size=len(g))
    with open(lay.path(desc["digest"]), "wb") as f:
        f.write(e)
    m = lay.manifest(lay.config([sha(good)]), [desc])
    lay.index(m)
    return "the layer blob's bytes hash to another digest (same size)", "refuse the layer: never serve the swapped content"


def case_size_mismatch(root):
    lay = Layout(root)
    t = plain_tar()
    desc = lay.blob(gz(t), MT_GZIP)
    desc["size"] -= 1
    lay.index(lay.manifest(lay.config([sha(t)]), [desc]))
    return "the layer descriptor's size is one byte less than the blob", "refuse the layer"


def case_bad_json(root):
    lay = Layout(root)
    lay.index(lay.blob(b'{"schemaVersion": 2, "config": {"mediaType": ', MT_MANIFEST))
    return "the manifest blob is truncated JSON", "refuse with a parse error"


def case_unsafe_paths(root):
    lay = Layout(root)
    l1 = tar([
        ("normal.txt", "file", "normal\n"),
        ("../escape-dotdot.txt", "file", "escaped with ..\n"),
        ("/abs-path.txt", "file", "absolute path\n"),
        ("a/", "dir", None),
        ("a/../../escape-mid.txt", "file", "escaped with a/../..\n"),
        ("a/b/../../../escape-deep.txt", "file", "escaped with a/b/../../..\n"),
        ("./dot-slash.txt", "file", "leading ./\n"),
        ("a//double//slash.txt", "file", "doubled slashes\n"),
        ("hardlink-dotdot", "hardlink", "../../etc/passwd"),
        ("hardlink-abs", "hardlink", "/etc/passwd"),
    ])
    l2 = tar([
        (".wh...", "file", b""),       # whiteout of ".."
        ("a/.wh.", "file", b""),       # whiteout of the empty name
        (".wh.normal.txt", "file", b""),  # a legitimate whiteout: normal.txt goes
        ("after.txt", "file", "layer 2 applied\n"),
    ])
    lay.index(lay.image([l1, l2]))
    return ("entries named ../x, /abs, a/../../x, a/b/../../../x, ./x, a//b; hard links to "
            "../../etc/passwd and /etc/passwd; layer 2 whites out '..' and ''"), \
        "nothing outside the image root: reject those entries (or the layer) or clamp them inside; never read host files"


def case_symlink_escape(root):
    lay = Layout(root)
    l1 = tar([
        ("escape-abs", "symlink", "/../../etc/passwd"),
        ("escape-rel", "symlink", "../../../etc"),
        ("escape-tmp", "symlink", "../../../tmp"),
        ("inside", "symlink", "etc/hostname"),
        ("etc/", "dir", None),
        ("etc/hostname", "file", "hostile\n"),
    ])
    l2 = tar([
        ("escape-rel/pkgfs-pwned", "file", "written through a symlinked directory\n"),
        ("escape-tmp/pkgfs-pwned", "file", "written through a symlinked directory\n"),
        ("hardlink-through", "hardlink", "escape-rel/passwd"),
    ])
    lay.index(lay.image([l1, l2]))
    return ("symlinks to /../../etc/passwd, ../../../etc, ../../../tmp; layer 2 adds "
            "escape-rel/pkgfs-pwned, escape-tmp/pkgfs-pwned and a hard link to escape-rel/passwd"), \
        "symlinks are served as symlinks (targets verbatim) and never followed while building the tree"


def case_huge_manifest(root):
    lay = Layout(root)
    t = plain_tar()
    layer = lay.blob(gz(t), MT_GZIP)
    m = lay.manifest(lay.config([sha(t)]), [layer], {"org.pkgfs.padding": "x" * (50 << 20)})
    lay.index(m)
    return f"a {m['size']} byte manifest (one 50 MiB annotation)", "refuse (size limit) or handle it without blowing memory"


def case_many_layers(root, n=100_000):
    lay = Layout(root)
    t = tar([("f", "file", "one small layer\n")])
    layer = lay.blob(gz(t), MT_GZIP)
    m = lay.manifest(lay.config([sha(t)] * n), [layer] * n)
    lay.index(m)
    return f"{n} layers (the same blob), a {m['size']} byte manifest", "refuse (layer limit) or mount it in bounded time and memory"


def case_nested_index(root, depth=1000):
    lay = Layout(root)
    desc = dict(lay.image([plain_tar()]), platform=dict(architecture="amd64", os="linux"))
    for _ in range(depth):
        desc = lay.json_blob(dict(schemaVersion=2, mediaType=MT_INDEX, manifests=[desc]), MT_INDEX)
    lay.index(desc)
    return f"index.json -> {depth} nested image indexes -> the manifest", "refuse past a nesting limit (or resolve it without deep recursion)"


def case_truncated_gzip(root):
    lay = Layout(root)
    t = tar([("data.bin", "file", bytes(range(256)) * 4096)] + [("after.txt", "file", "x\n")])
    z = gz(t)
    cut = z[: len(z) // 2]
    layer = lay.blob(cut, MT_GZIP)
    lay.index(lay.manifest(lay.config([sha(t)]), [layer]))
    return "the layer's gzip stream stops half way (its digest is of the truncated bytes)", "an I/O error for what is missing, no hang, no crash"


def case_gzip_bomb(root, size=1 << 30):
    lay = Layout(root)
    ti = tarfile.TarInfo("zeros.bin")
    ti.size, ti.mode, ti.mtime = size, 0o644, MTIME
    header = ti.tobuf(tarfile.PAX_FORMAT)
    trailer = bytes((-size) % 512) + bytes(1024)
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip wrapper, mtime 0
    diff = hashlib.sha256()
    out = [comp.compress(header)]
    diff.update(header)
    zero = bytes(1 << 20)
    for _ in range(size >> 20):
        out.append(comp.compress(zero))
        diff.update(zero)
    out.append(comp.compress(trailer))
    diff.update(trailer)
    out.append(comp.flush())
    layer = lay.blob(b"".join(out), MT_GZIP)
    lay.index(lay.manifest(lay.config(["sha256:" + diff.hexdigest()]), [layer]))
    return f"a {layer['size']} byte layer holding a {size} byte file of zeros", "serve it lazily or refuse it; bounded memory"


CASES = {
    "missing-blob": case_missing_blob,
    "missing-manifest": case_missing_manifest,
    "digest-mismatch": case_digest_mismatch,
    "size-mismatch": case_size_mismatch,
    "bad-json": case_bad_json,
    "unsafe-paths": case_unsafe_paths,
    "symlink-escape": case_symlink_escape,
    "huge-manifest": case_huge_manifest,
    "many-layers": case_many_layers,
    "nested-index": case_nested_index,
    "truncated-gzip": case_truncated_gzip,
    "gzip-bomb": case_gzip_bomb,
}


def main(argv):
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = argv[0]
    os.makedirs(out, exist_ok=True)
    catalogue = {}
    for name, make in CASES.items():
        what, expect = make(os.path.join(out, name))
        catalogue[name] = dict(layout=name, tag="latest", flaw=what, expect=expect)
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(catalogue, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
