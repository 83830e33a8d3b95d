#!/usr/bin/env python3
"""Print the table of contents of a zstd:chunked (or eStargz) layer blob.

    dump_toc.py BLOB [--entries N] [--json] [--verify]
    dump_toc.py LAYOUT --layer I [--tag T] [...]   (layer I of the manifest tagged T,
                                                   default latest; its annotations are
                                                   checked against the footer)

zstd:chunked, as written by containers/storage (skopeo --dest-compress-format
zstd:chunked) and by stargz-snapshotter (ctr-remote image convert --zstdchunked):

  blob = zstd frames of the tar stream (each regular file's content in frames of its
         own, tar headers in frames between them)
       + skippable frame [50 2a 4d 18][u32 LE len] + TOC: one zstd frame of JSON
       (+ newer writers: a skippable frame holding the zstd-compressed tar-split JSON)
       + footer skippable frame [50 2a 4d 18][u32 LE 40 or 64] + payload of u64 LE:
           40 bytes (old):  tocOffset tocLength tocUncompressed tocType=1 "GnUlInUx"
           64 bytes (new):  tocOffset tocLength tocUncompressed tocType=1
                            tarsplitOffset tarsplitLength tarsplitUncompressed "GNUlInUx"
  tocOffset points at the zstd frame (after the 8-byte skippable header); the layer
  descriptor repeats it in io.containers.zstd-chunked.manifest-position
  (io.github.containers.… in newer writers) = "offset:length:uncompressed:type",
  and manifest-checksum = sha256 of the tocLength compressed bytes.

eStargz: gzip members; the last 51 bytes are an empty gzip member whose FEXTRA holds
"%016x" % tocOffset + "STARGZ"; at tocOffset a gzip member holds a tar with
stargz.index.json (same entry schema).

--verify decompresses every regular file (and chunk) from its offsets and checks the
digest from the TOC. Decompression: the `zstandard` or `pyzstd` module if importable,
else the zstd CLI.
"""

import collections
import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import zlib

SKIPPABLE = b"\x50\x2a\x4d\x18"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
MAGIC_OLD = b"GnUlInUx"   # containers/storage <= 1.4x, stargz-snapshotter
MAGIC_NEW = b"GNUlInUx"   # containers/storage with tar-split in the blob
ANNOTATION_PREFIXES = ("io.github.containers.zstd-chunked.", "io.containers.zstd-chunked.")


def zstd_decompress(data):
    try:
        import zstandard
        return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True).read()
    except ImportError:
        pass
    try:
        import pyzstd
        return pyzstd.decompress(data)
    except ImportError:
        pass
    return subprocess.run(["zstd", "-dcq"], input=data, stdout=subprocess.PIPE, check=True).stdout


def gunzip_member(data):
    return zlib.decompressobj(31).decompress(data)


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Blob:
    def __init__(self, path):
        self.f = open(path, "rb")
        self.size = os.fstat(self.f.fileno()).st_size

    def read(self, off, n):
        self.f.seek(off)
        return self.f.read(n)


def parse_zstd_footer(blob):
    tail = blob.read(max(0, blob.size - 72), 72)
    magic = tail[-8:]
    for payload_len, want_magic in ((40, MAGIC_OLD), (64, MAGIC_NEW), (40, MAGIC_NEW), (64, MAGIC_OLD)):
        if len(tail) < payload_len + 8:
            continue
        frame = tail[-(payload_len + 8):]
        if frame[:4] == SKIPPABLE and struct.unpack("<I", frame[4:8])[0] == payload_len and magic == want_magic:
            vals = struct.unpack("<" + "Q" * (payload_len // 8 - 1), frame[8:-8])
            foot = dict(footer_bytes=payload_len + 8, payload_len=payload_len, magic=magic.decode(),
                        toc_offset=vals[0], toc_length=vals[1], toc_uncompressed=vals[2], toc_type=vals[3])
            if payload_len == 64:
                foot.update(tarsplit_offset=vals[4], tarsplit_length=vals[5], tarsplit_uncompressed=vals[6])
            return foot
    raise SystemExit(f"no zstd:chunked footer (last 8 bytes {magic!r})")


def load_zstd_chunked(blob):
    foot = parse_zstd_footer(blob)
    off, n = foot["toc_offset"], foot["toc_length"]
    hdr = blob.read(off - 8, 8)
    foot["toc_skippable_header_ok"] = hdr[:4] == SKIPPABLE and struct.unpack("<I", hdr[4:])[0] == n
    raw = blob.read(off, n)
    foot["toc_frame_magic"] = raw[:4].hex()
    foot["toc_sha256"] = sha256(raw)
    text = zstd_decompress(raw)
    foot["toc_uncompressed_ok"] = len(text) == foot["toc_uncompressed"]
    if "tarsplit_offset" in foot:
        ts = zstd_decompress(blob.read(foot["tarsplit_offset"], foot["tarsplit_length"]))
        kinds = collections.Counter(json.loads(line).get("type") for line in ts.splitlines() if line.strip())
        foot["tarsplit_lines_by_type"] = dict(kinds)
    return "zstd:chunked", foot, json.loads(text)


def load_estargz(blob):
    tail = blob.read(blob.size - 51, 51)
    i = tail.find(b"STARGZ")
    if i < 16:
        raise SystemExit("no eStargz footer")
    off = int(tail[i - 16:i], 16)
    foot = dict(footer_bytes=51, toc_offset=off)
    tar_bytes = gunzip_member(blob.read(off, blob.size - 51 - off))
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as t:
        toc = json.load(t.extractfile("stargz.index.json"))
    foot["toc_member_compressed"] = blob.size - 51 - off
    return "eStargz", foot, toc


def verify(blob, fmt, toc):
    """Decompress each file/chunk from its offsets; compare with the TOC digests."""
    entries = toc["entries"]
    offsets = sorted({e["offset"] for e in entries if e.get("offset")})
    nxt = {o: (offsets[i + 1] if i + 1 < len(offsets) else None) for i, o in enumerate(offsets)}
    ok = bad = 0
    problems = []

    def payload(start, end, want):
        if fmt == "eStargz":
            return gunzip_member(blob.read(start, (end or blob.size) - start))[:want]
        return zstd_decompress(blob.read(start, (end or blob.size) - start))[:want]

    size = 0  # of the file the next chunks belong to
    for e in entries:
        if e.get("type") == "reg" and e.get("size"):
            size = e["size"]
            if e.get("chunkSize") is not None:   # the file's first chunk
                length, want, end = e["chunkSize"], e.get("chunkDigest"), nxt[e["offset"]]
            else:                                # the whole file in one frame (or member)
                length, want, end = e["size"], e.get("digest"), e.get("endOffset") or nxt[e["offset"]]
            checks = [(e["name"], payload(e["offset"], end, length), want)]
        elif e.get("type") == "chunk":
            # eStargz writers leave the last chunk's size out: it runs to the file's end.
            length = e.get("chunkSize") or size - e["chunkOffset"]
            data = payload(e["offset"], nxt[e["offset"]], length)
            if len(data) != length:
                bad += 1
                problems.append(f"{e['name']}@{e.get('chunkOffset')}: {len(data)} of {length} bytes")
                continue
            checks = [(f"{e['name']}@{e.get('chunkOffset')}", data, e.get("chunkDigest"))]
        else:
            continue
        for name, data, want in checks:
            if want and sha256(data) != want:
                bad += 1
                problems.append(name)
            else:
                ok += 1
    return ok, bad, problems[:10]


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    args = list(argv)

    def opt(name, default=None):
        if name in args:
            i = args.index(name)
            val = args[i + 1]
            del args[i:i + 2]
            return val
        return default

    def flag(name):
        if name in args:
            args.remove(name)
            return True
        return False

    n_entries = int(opt("--entries", "12"))
    layer = opt("--layer")
    tag = opt("--tag", "latest")
    as_json = flag("--json")
    do_verify = flag("--verify")
    target = args[0]
    annotations = {}
    if os.path.isdir(target):
        index = json.load(open(os.path.join(target, "index.json")))
        mdesc = [d for d in index["manifests"]
                 if d.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag][0]
        manifest = json.load(open(os.path.join(target, "blobs", "sha256", mdesc["digest"][7:])))
        ldesc = manifest["layers"][int(layer or 0)]
        annotations = ldesc.get("annotations", {})
        target = os.path.join(target, "blobs", "sha256", ldesc["digest"][7:])
    blob = Blob(target)
    head = blob.read(0, 4)
    if head[:2] == b"\x1f\x8b":
        fmt, foot, toc = load_estargz(blob)
    else:
        fmt, foot, toc = load_zstd_chunked(blob)
    ann = {}
    for k, v in annotations.items():
        for p in ANNOTATION_PREFIXES:
            if k.startswith(p):
                ann[k] = v
    if fmt == "zstd:chunked" and ann:
        pos = [v for k, v in ann.items() if k.endswith("manifest-position")]
        chk = [v for k, v in ann.items() if k.endswith("manifest-checksum")]
        if pos:
            foot["annotation_position_matches_footer"] = pos[0] == "%d:%d:%d:%d" % (
                foot["toc_offset"], foot["toc_length"], foot["toc_uncompressed"], foot["toc_type"])
        if chk:
            foot["annotation_checksum_matches_toc"] = chk[0] == foot["toc_sha256"]
    entries = toc.get("entries", [])
    summary = dict(blob=target, blob_size=blob.size, format=fmt, footer=foot, annotations=ann,
                   toc_version=toc.get("version"), toc_top_level_keys=sorted(toc),
                   entries=len(entries),
                   entries_by_type=dict(collections.Counter(e.get("type") for e in entries)),
                   entry_fields=sorted({k for e in entries for k in e}),
                   chunk_types=dict(collections.Counter(e.get("chunkType", "data") for e in entries
                                                         if e.get("type") == "chunk")))
    if do_verify:
        ok, bad, problems = verify(blob, fmt, toc)
        summary["verify"] = dict(ok=ok, bad=bad, first_problems=problems)
    if as_json:
        print(json.dumps(dict(summary, toc=toc), indent=1))
    else:
        print(json.dumps(summary, indent=1))
        for e in entries[:n_entries]:
            print(json.dumps(e, separators=(",", ":")))
        if 0 < n_entries < len(entries):
            print(f"... {len(entries) - n_entries} more entries")
    if do_verify and summary["verify"]["bad"]:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
