#!/usr/bin/env python3
"""Small, independent helpers for the container-image fixtures (stdlib + the zstd CLI).

    ocitool.py tree ROOT [--ignore NAME]...      one line per path under ROOT (sorted):
        path, type, mode, uid:gid, size, content sha256 / symlink target / device
        numbers, mtime, xattrs (every namespace), hard-link group (the smallest path
        of names sharing an inode). --ignore drops top-level names (eStargz landmarks).
    ocitool.py check LAYOUT [--tag T] [--same-layers-as LAYOUT2]
        Walks index.json -> manifest -> config/layers: every blob's sha256 and size
        against its descriptor, every layer decompressed (by media type: gzip, zstd
        via `zstd -dc`, plain tar) against the config's diff_ids. With
        --same-layers-as, the diff_ids must equal LAYOUT2's (byte-identical tar streams).
        Prints a JSON summary (index, manifest, layers, annotations).
    ocitool.py check-docker-archive TAR          the same for a docker-archive tar.
    ocitool.py plain LAYOUT OUT [--tag T]        OUT: a copy of the image whose layers are
        stored uncompressed (media type ...layer.v1.tar), decompressed by gzip/zstd CLI,
        so that umoci 0.4.7 (no zstd support) can unpack zstd images.
"""

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tarfile

CHUNK = 1 << 20


# ---------------------------------------------------------------- tree listing

def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def fmt_xattrs(path):
    try:
        names = sorted(os.listxattr(path, follow_symlinks=False))
    except OSError:
        return ""
    out = []
    for n in names:
        v = os.getxattr(path, n, follow_symlinks=False)
        if all(32 <= b < 127 for b in v) and b'"' not in v:
            out.append(f'{n}="{v.decode()}"')
        else:
            out.append(f"{n}=0x{v.hex()}")
    return ",".join(out)


def tree(root, ignore=()):
    root = os.fsencode(root)
    nodes = {}
    inodes = {}
    for top, dirs, files in os.walk(root):
        if top == root:
            dirs[:] = [d for d in dirs if os.fsdecode(d) not in ignore]
            files = [f for f in files if os.fsdecode(f) not in ignore]
        for name in sorted(dirs + files):
            full = os.path.join(top, name)
            rel = os.fsdecode(os.path.relpath(full, root))
            st = os.lstat(full)
            kind = stat.S_IFMT(st.st_mode)
            t = {stat.S_IFREG: "file", stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink",
                 stat.S_IFIFO: "fifo", stat.S_IFCHR: "char", stat.S_IFBLK: "block",
                 stat.S_IFSOCK: "socket"}[kind]
            what = ""
            size = ""
            if kind == stat.S_IFREG:
                size = str(st.st_size)
                what = file_sha256(full)
            elif kind == stat.S_IFLNK:
                what = "-> " + os.fsdecode(os.readlink(full))
            elif kind in (stat.S_IFCHR, stat.S_IFBLK):
                what = f"{os.major(st.st_rdev)},{os.minor(st.st_rdev)}"
            # Directory mtimes depend on the order an unpacker creates children in;
            # everything else must keep the archive's mtime.
            mtime = "" if kind == stat.S_IFDIR else str(int(st.st_mtime))
            nodes[rel] = [rel, t, f"{st.st_mode & 0o7777:04o}", f"{st.st_uid}:{st.st_gid}",
                          size, what, mtime, fmt_xattrs(full)]
            if kind != stat.S_IFDIR and st.st_nlink > 1:
                inodes.setdefault((st.st_dev, st.st_ino), []).append(rel)
    link = {}
    for names in inodes.values():
        if len(names) > 1:
            first = min(names)
            for n in names:
                link[n] = first
    lines = []
    for rel in sorted(nodes):
        row = nodes[rel] + ["link=" + link[rel] if rel in link else ""]
        lines.append("\t".join(row))
    return lines


# ---------------------------------------------------------------- layouts

class Bad(Exception):
    pass


def blob_path(layout, digest):
    algo, _, hexd = digest.partition(":")
    if algo != "sha256" or len(hexd) != 64 or not all(c in "0123456789abcdef" for c in hexd):
        raise Bad(f"unsupported digest {digest!r}")
    return os.path.join(layout, "blobs", algo, hexd)


def read_blob(layout, desc):
    p = blob_path(layout, desc["digest"])
    data = open(p, "rb").read()
    if len(data) != desc["size"]:
        raise Bad(f"{desc['digest']}: size {len(data)}, descriptor says {desc['size']}")
    if "sha256:" + hashlib.sha256(data).hexdigest() != desc["digest"]:
        raise Bad(f"{desc['digest']}: content does not match its digest")
    return data


def decompressor_cmd(media_type, path):
    if media_type.endswith("+gzip") or media_type.endswith(".tar.gzip"):
        return ["gzip", "-dc", path]
    if media_type.endswith("+zstd") or media_type.endswith(".tar.zstd"):
        return ["zstd", "-dcq", path]
    if media_type.endswith(".tar") or media_type.endswith("layer.v1.tar"):
        return ["cat", path]
    raise Bad(f"unknown layer media type {media_type}")


def check_layer(layout, desc, want_diff_id):
    p = blob_path(layout, desc["digest"])
    h = hashlib.sha256()
    n = 0
    with open(p, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            n += len(chunk)
    if n != desc["size"] or "sha256:" + h.hexdigest() != desc["digest"]:
        raise Bad(f"layer {desc['digest']}: blob does not match its descriptor")
    proc = subprocess.Popen(decompressor_cmd(desc["mediaType"], p), stdout=subprocess.PIPE)
    d = hashlib.sha256()
    size = 0
    while chunk := proc.stdout.read(CHUNK):
        d.update(chunk)
        size += len(chunk)
    if proc.wait() != 0:
        raise Bad(f"layer {desc['digest']}: decompression failed")
    got = "sha256:" + d.hexdigest()
    if got != want_diff_id:
        raise Bad(f"layer {desc['digest']}: uncompressed {got}, config diff_id {want_diff_id}")
    return size


def pick_manifest(layout, tag):
    index = json.load(open(os.path.join(layout, "index.json")))
    descs = index["manifests"]
    if tag is not None:
        descs = [d for d in descs
                 if d.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag]
    if len(descs) != 1:
        raise Bad(f"{layout}: {len(descs)} manifests for tag {tag!r}")
    return index, descs[0]


def check(layout, tag="latest", same_as=None):
    index, mdesc = pick_manifest(layout, tag)
    manifest = json.loads(read_blob(layout, mdesc))
    config = json.loads(read_blob(layout, manifest["config"]))
    diff_ids = config["rootfs"]["diff_ids"]
    if len(diff_ids) != len(manifest["layers"]):
        raise Bad(f"{len(manifest['layers'])} layers but {len(diff_ids)} diff_ids")
    layers = []
    for desc, diff_id in zip(manifest["layers"], diff_ids):
        usize = check_layer(layout, desc, diff_id)
        layers.append(dict(mediaType=desc["mediaType"], size=desc["size"], uncompressed=usize,
                           digest=desc["digest"], diff_id=diff_id,
                           annotations=desc.get("annotations", {})))
    if same_as is not None:
        _, odesc = pick_manifest(same_as, tag)
        om = json.loads(read_blob(same_as, odesc))
        oc = json.loads(read_blob(same_as, om["config"]))
        if oc["rootfs"]["diff_ids"] != diff_ids:
            raise Bad(f"diff_ids differ from {same_as}")
    return dict(layout=layout, index_manifests=len(index["manifests"]),
                index_mediaType=index.get("mediaType"), manifest_descriptor=mdesc,
                manifest_mediaType=manifest.get("mediaType"),
                config_mediaType=manifest["config"]["mediaType"],
                platform=f"{config.get('os')}/{config.get('architecture')}",
                layers=layers)


def check_docker_archive(path):
    with tarfile.open(path) as t:
        manifest = json.load(t.extractfile("manifest.json"))
        if len(manifest) != 1:
            raise Bad("docker-archive with more than one image")
        m = manifest[0]
        config = json.load(t.extractfile(m["Config"]))
        layers = []
        for name, diff_id in zip(m["Layers"], config["rootfs"]["diff_ids"]):
            member = t.getmember(name)
            while member.issym():
                member = t.getmember(os.path.normpath(os.path.join(os.path.dirname(member.name), member.linkname)))
            h = hashlib.sha256()
            f = t.extractfile(member)
            while chunk := f.read(CHUNK):
                h.update(chunk)
            if "sha256:" + h.hexdigest() != diff_id:
                raise Bad(f"{name}: not the config's diff_id {diff_id}")
            layers.append(dict(name=name, size=member.size, diff_id=diff_id))
    return dict(archive=path, repo_tags=m.get("RepoTags"), config=m["Config"], layers=layers)


def plain(layout, out, tag="latest"):
    """Copy of the image with uncompressed layers (for umoci, which lacks zstd)."""
    index, mdesc = pick_manifest(layout, tag)
    manifest = json.loads(read_blob(layout, mdesc))
    os.makedirs(os.path.join(out, "blobs", "sha256"), exist_ok=True)

    def put(data):
        hexd = hashlib.sha256(data).hexdigest()
        with open(os.path.join(out, "blobs", "sha256", hexd), "wb") as f:
            f.write(data)
        return "sha256:" + hexd, len(data)

    shutil.copyfile(blob_path(layout, manifest["config"]["digest"]),
                    blob_path(out, manifest["config"]["digest"]))
    layers = []
    for desc in manifest["layers"]:
        tmp = os.path.join(out, "blobs", "sha256", "partial")
        with open(tmp, "wb") as f:
            subprocess.run(decompressor_cmd(desc["mediaType"], blob_path(layout, desc["digest"])),
                           stdout=f, check=True)
        digest = "sha256:" + file_sha256(tmp)
        size = os.path.getsize(tmp)
        os.replace(tmp, blob_path(out, digest))
        layers.append(dict(mediaType="application/vnd.oci.image.layer.v1.tar", digest=digest, size=size))
    new = dict(schemaVersion=2, mediaType="application/vnd.oci.image.manifest.v1+json",
               config=manifest["config"], layers=layers)
    digest, size = put(json.dumps(new).encode())
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump(dict(schemaVersion=2, manifests=[dict(
            mediaType="application/vnd.oci.image.manifest.v1+json", digest=digest, size=size,
            annotations={"org.opencontainers.image.ref.name": tag})]), f)
    with open(os.path.join(out, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion":"1.0.0"}')


def main(argv):
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = argv[0], argv[1:]

    def opt(name, default=None, many=False):
        vals = [args[i + 1] for i, a in enumerate(args) if a == name]
        return vals if many else (vals[-1] if vals else default)

    pos = [a for i, a in enumerate(args) if not a.startswith("--") and (i == 0 or not args[i - 1].startswith("--"))]
    try:
        if cmd == "tree":
            for line in tree(pos[0], set(opt("--ignore", many=True))):
                sys.stdout.buffer.write(os.fsencode(line) + b"\n")
        elif cmd == "check":
            print(json.dumps(check(pos[0], opt("--tag", "latest"), opt("--same-layers-as")), indent=1))
        elif cmd == "check-docker-archive":
            print(json.dumps(check_docker_archive(pos[0]), indent=1))
        elif cmd == "plain":
            plain(pos[0], pos[1], opt("--tag", "latest"))
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except Bad as e:
        print(f"ocitool {cmd}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
