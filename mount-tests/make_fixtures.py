#!/usr/bin/env python3
"""The catalogue of test archives, made by real tools.

    make_fixtures.py OUTDIR [--large]

Each subdirectory of OUTDIR is a package set that the mount tests mount as layers:

  basic/       Info-ZIP `zip` stored (-0) and deflated (-6) archives with symlinks (-y),
               one from `python3 -m zipfile -c`, a `.jar`-named zip (detection by
               content), and README.txt (not an archive: ignored)
  empty/       a 22-byte empty archive beside a normal one
  zip64-many/  70,000 entries (ZIP64 end records), written by `zipfile`
  conflicts/   three layers exercising every merge rule, duplicates inside one archive
  corrupt/     bad CRCs, a garbage deflate stream, a truncated archive, garbage,
               bzip2 and encrypted members, each beside good members
  unsafe/      `..`, absolute, drive-letter, backslash and untidy names
  large/       (--large) a member of 4 GiB + 12345 zero bytes, deflated, ZIP64

Generation is deterministic and idempotent: a stamp file per set records that it is
complete, so repeated test runs reuse the archives.
"""

import os
import random
import shutil
import subprocess
import sys
import zipfile

VERSION = "2"
ENV = dict(os.environ, TZ="UTC")
# Fixed times, some odd seconds, one before 2000 (DOS dates start in 1980).
TIMES = [946684799, 1234567891, 1600000001, 1700000000, 1041379200]


def sh(*cmd, cwd=None):
    subprocess.run(cmd, check=True, cwd=cwd, env=ENV, stdout=subprocess.DEVNULL)


def write(path, data, mode=0o644, when=None):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)
    if when is not None:
        os.utime(path, (when, when))


def make_tree(root, seed):
    """A source tree with the shapes that matter: sizes around block edges, empty and
    deep directories, odd names and modes, symlinks of every kind."""
    rng = random.Random(seed)
    sizes = [0, 1, 4095, 4096, 65535, 131071, 131072, 131073, 262145, (1 << 20) + 7]
    for i, n in enumerate(sizes):
        data = bytes(rng.getrandbits(8) for _ in range(min(n, 64))) * (n // 64 + 1)
        write(f"{root}/sizes/f{n}.bin", data[:n], when=TIMES[i % len(TIMES)])
    write(f"{root}/random.bin", rng.randbytes(3 << 20), when=TIMES[1])
    text = "".join(f"line {i} {rng.random()}\n" for i in range(120_000)).encode()
    write(f"{root}/text.txt", text[: 5 << 20], when=TIMES[2])
    write(f"{root}/a/b/c/d/deep.txt", b"deep\n", when=TIMES[3])
    os.makedirs(f"{root}/empty-dir/inner-empty", exist_ok=True)
    write(f"{root}/names/héllo wörld.txt", "non-ASCII\n".encode(), when=TIMES[0])
    write(f"{root}/names/日本語.txt", "日本語\n".encode(), when=TIMES[4])
    write(f"{root}/names/with space", b"space\n", when=TIMES[1])
    write(f"{root}/names/" + "n" * 255, b"long name\n", when=TIMES[2])
    for mode in (0o644, 0o755, 0o600, 0o444, 0o640):
        write(f"{root}/modes/m{mode:o}", f"{mode:o}\n".encode(), mode=mode, when=TIMES[3])
    os.makedirs(f"{root}/modes/private-dir", exist_ok=True)
    write(f"{root}/modes/private-dir/x", b"x\n", when=TIMES[0])
    os.symlink("../text.txt", f"{root}/a/to-file")
    os.symlink("b/c", f"{root}/a/to-dir")
    os.symlink("/etc/hostname", f"{root}/a/absolute")
    os.symlink("nowhere", f"{root}/a/dangling")
    for d in ("a", "modes", "sizes", "names"):
        os.utime(f"{root}/{d}", (TIMES[4], TIMES[4]))
    os.chmod(f"{root}/modes/private-dir", 0o700)
    os.utime(f"{root}/modes/private-dir", (TIMES[2], TIMES[2]))


def basic(out):
    work = out + ".src"
    shutil.rmtree(work, ignore_errors=True)
    for name, seed in (("stored", 1), ("deflate", 2), ("pyzip", 3), ("jar", 4)):
        make_tree(f"{work}/{name}/{name}-pkg", seed)
    sh("zip", "-q", "-r", "-0", "-y", f"{out}/a-stored.zip", "stored-pkg", cwd=f"{work}/stored")
    sh("zip", "-q", "-r", "-6", "-y", f"{out}/b-deflate.zip", "deflate-pkg", cwd=f"{work}/deflate")
    # python -m zipfile follows symlinks and stores no directory modes: still a real tool.
    shutil.rmtree(f"{work}/pyzip/pyzip-pkg/a", ignore_errors=True)
    sh(sys.executable, "-m", "zipfile", "-c", f"{out}/c-pyzip.zip", "pyzip-pkg", cwd=f"{work}/pyzip")
    sh("zip", "-q", "-r", "-9", "-y", f"{out}/d-lib.jar", "jar-pkg", cwd=f"{work}/jar")
    write(f"{out}/README.txt", b"not an archive\n")
    shutil.rmtree(work)


def empty(out):
    zipfile.ZipFile(f"{out}/empty.zip", "w").close()
    with zipfile.ZipFile(f"{out}/one.zip", "w") as z:
        z.writestr("one.txt", "one\n")


def zip64_many(out):
    path = f"{out}/many.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for i in range(70_000):
            info = zipfile.ZipInfo(f"d{i % 70:02d}/f{i:05d}.txt", (2020, 1, 2, 3, 4, 6))
            info.external_attr = (0o100644) << 16
            info.create_system = 3
            z.writestr(info, f"{i}\n")
    with open(path, "rb") as f:
        assert b"PK\x06\x06" in f.read()[-200:], "ZIP64 end record expected"


def zinfo(name, mode, when=(2021, 5, 6, 7, 8, 10)):
    info = zipfile.ZipInfo(name, when)
    info.create_system = 3
    info.external_attr = mode << 16
    if name.endswith("/"):
        info.external_attr |= 0x10
    return info


def conflicts(out):
    import warnings
    warnings.simplefilter("ignore")  # zipfile warns about duplicate names: intended here
    with zipfile.ZipFile(f"{out}/10-base.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zinfo("shared/", 0o40700), "")
        z.writestr(zinfo("shared/override.txt", 0o100644), "base\n")
        z.writestr(zinfo("shared/base-only.txt", 0o100600), "base only\n")
        z.writestr(zinfo("becomes-file/inner.txt", 0o100644), "inside a dir\n")
        z.writestr(zinfo("becomes-dir", 0o100644), "a file first\n")
        z.writestr(zinfo("replaced-by-link", 0o100644), "a file\n")
        z.writestr(zinfo("dup.txt", 0o100644), "first copy\n")
        z.writestr(zinfo("dup.txt", 0o100640), "second copy wins\n")
    with zipfile.ZipFile(f"{out}/20-override.zip", "w", zipfile.ZIP_STORED) as z:
        z.writestr(zinfo("shared/", 0o40750, (2022, 1, 1, 0, 0, 0)), "")
        z.writestr(zinfo("shared/override.txt", 0o100755), "override\n")
        z.writestr(zinfo("becomes-file", 0o100644), "a later file loses to the dir\n")
        z.writestr(zinfo("becomes-dir/now-a-dir.txt", 0o100644), "the dir wins\n")
        z.writestr(zinfo("replaced-by-link", 0o120777), "shared/override.txt")
    with zipfile.ZipFile(f"{out}/30-clash.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zinfo("shared/override.txt", 0o100444), "top layer\n")
        z.writestr(zinfo("top/", 0o40755), "")
        z.writestr(zinfo("top", 0o100644), "file after dir in one archive\n")


def patch(path, old, new):
    with open(path, "rb") as f:
        data = f.read()
    assert data.count(old) >= 1, (path, old)
    with open(path, "wb") as f:
        f.write(data.replace(old, new))


def corrupt(out):
    good = b"good member\n" * 100
    with zipfile.ZipFile(f"{out}/good.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("good/ok.txt", good)
    # badcrc.zip: a stored member with one data byte flipped; a deflated member whose
    # recorded CRC (local and central) is wrong.
    with zipfile.ZipFile(f"{out}/badcrc.zip", "w") as z:
        z.writestr("crc/fine.txt", good, zipfile.ZIP_DEFLATED)
        z.writestr("crc/stored-flipped.txt", b"STORED-PAYLOAD-" * 50, zipfile.ZIP_STORED)
        z.writestr("crc/deflate-badcrc.txt", b"deflated payload\n" * 500, zipfile.ZIP_DEFLATED)
    patch(f"{out}/badcrc.zip", b"STORED-PAYLOAD-STORED", b"STORED-PAYLOAD-STOREX")
    with zipfile.ZipFile(f"{out}/badcrc.zip") as z:
        crc = z.getinfo("crc/deflate-badcrc.txt").CRC
    patch(f"{out}/badcrc.zip", crc.to_bytes(4, "little"), (crc ^ 0x5A5A).to_bytes(4, "little"))
    # badstream.zip: compressed bytes replaced by garbage of the same length.
    payload = bytes(random.Random(7).getrandbits(8) for _ in range(20000))
    with zipfile.ZipFile(f"{out}/badstream.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("stream/fine.txt", good)
        z.writestr("stream/garbage.bin", payload)
    with zipfile.ZipFile(f"{out}/badstream.zip") as z:
        info = z.getinfo("stream/garbage.bin")
    with open(f"{out}/badstream.zip", "r+b") as f:
        f.seek(info.header_offset + 30 + len(info.filename.encode()))
        f.write(b"\xff" * 16 + bytes(random.Random(8).getrandbits(8) for _ in range(info.compress_size - 16)))
    # truncated.zip: a good archive cut before its central directory.
    with zipfile.ZipFile(f"{out}/truncated.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("trunc/a.txt", good * 10)
    with open(f"{out}/truncated.zip", "r+b") as f:
        f.truncate(os.path.getsize(f"{out}/truncated.zip") // 2)
    write(f"{out}/garbage.zip", bytes(random.Random(9).getrandbits(8) for _ in range(5000)))
    # unsupported.zip: bzip2 and an encrypted member (zip -P), beside a good one.
    with zipfile.ZipFile(f"{out}/unsupported.zip", "w") as z:
        z.writestr("unsup/fine.txt", good, zipfile.ZIP_DEFLATED)
        z.writestr("unsup/bzip2.txt", good * 3, zipfile.ZIP_BZIP2)
    src = out + ".enc"
    write(f"{src}/unsup/secret.txt", b"secret\n" * 100, when=TIMES[3])
    sh("zip", "-q", "-P", "secret", f"{os.path.abspath(out)}/unsupported.zip", "unsup/secret.txt", cwd=src)
    shutil.rmtree(src)


def unsafe(out):
    names = ["../escape.txt", "a/../../escape2.txt", "/abs/path.txt", "C:/drive.txt",
             "a\\windows\\path.txt", "./dot/./file.txt", "dup//slash.txt", "ok.txt",
             "nul\0hidden.txt"]
    # zipfile sanitises names on write, so write unique placeholders of the same length
    # and then put the raw hostile names into both headers.
    holders = [f"Q{i}".ljust(len(n), "P") for i, n in enumerate(names)]
    with zipfile.ZipFile(f"{out}/paths.zip", "w") as z:
        for i, (n, h) in enumerate(zip(names, holders)):
            z.writestr(zinfo(h, 0o100644), f"entry {i}: {n}\n")
    for n, h in zip(names, holders):
        patch(f"{out}/paths.zip", h.encode(), n.encode())


def hostile(out):
    # Garbage before a normal archive (self-extracting style, offsets not adjusted).
    inner = out + "/.inner.zip"
    with zipfile.ZipFile(inner, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zinfo("sfx/inside.txt", 0o100644), "found past the stub\n" * 50)
    with open(inner, "rb") as f:
        body = f.read()
    os.remove(inner)
    write(f"{out}/selfextract.zip", random.Random(11).randbytes(20000) + body)
    # 100,000 entries with one name: the last one wins.
    with zipfile.ZipFile(f"{out}/dup100k.zip", "w", zipfile.ZIP_STORED) as z:
        import warnings
        warnings.simplefilter("ignore")
        for i in range(100_000):
            z.writestr(zinfo("dup/same.txt", 0o100644), f"copy {i}\n")
    # A very deep tree, an over-long name, symlink loops.
    with zipfile.ZipFile(f"{out}/shapes.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zinfo("deep/" + "d/" * 1000 + "leaf.txt", 0o100644), "deep leaf\n")
        z.writestr(zinfo("long/" + "n" * 256, 0o100644), "name too long: skipped\n")
        z.writestr(zinfo("long/" + "n" * 255, 0o100644), "longest name\n")
        z.writestr(zinfo("loop/a", 0o120777), "b")
        z.writestr(zinfo("loop/b", 0o120777), "a")
        z.writestr(zinfo("loop/self", 0o120777), "self")
        z.writestr(zinfo("loop/up", 0o120777), "../../../../../../../../etc/passwd")
    # Overlapping entries (the zip-bomb trick): a second central record whose local
    # header offset points at the first member's header.
    with zipfile.ZipFile(f"{out}/overlap.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zinfo("ovl/first.txt", 0o100644), "first\n" * 100)
        z.writestr(zinfo("ovl/other.txt", 0o100644), "other\n" * 100)
    with open(f"{out}/overlap.zip", "r+b") as f:
        data = f.read()
        cd = data.rfind(b"PK\x01\x02")  # other.txt's central record
        f.seek(cd + 42)
        f.write((0).to_bytes(4, "little"))  # first.txt's local header is at offset 0
    # ZIP64 markers without a ZIP64 field: the sizes read as 4 GiB - 1 and lie.
    with zipfile.ZipFile(f"{out}/bogus64.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zinfo("b64/fine.txt", 0o100644), "fine\n")
        z.writestr(zinfo("b64/liar.txt", 0o100644), "PAYLOAD-" * 100)
    with zipfile.ZipFile(f"{out}/bogus64.zip") as z:
        info = z.getinfo("b64/liar.txt")
    with open(f"{out}/bogus64.zip", "r+b") as f:
        data = f.read()
        cd = data.rfind(b"PK\x01\x02")  # the last central record is liar.txt's
        f.seek(cd + 20)
        f.write(b"\xff" * 8)  # compressed and uncompressed size


def large(out):
    path = f"{out}/huge.zip"
    with zipfile.ZipFile(path + ".tmp", "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        z.writestr("small.txt", "next to a huge member\n")
        chunk = bytes(8 << 20)
        with z.open(zinfo("zeros.bin", 0o100644), "w", force_zip64=True) as f:
            left = (4 << 30) + 12345
            while left:
                n = min(left, len(chunk))
                f.write(chunk[:n])
                left -= n
    os.rename(path + ".tmp", path)


SETS = {"basic": basic, "empty": empty, "zip64-many": zip64_many, "conflicts": conflicts,
        "corrupt": corrupt, "unsafe": unsafe, "hostile": hostile}


def main(argv):
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    out = argv[0]
    sets = dict(SETS)
    if "--large" in argv[1:]:
        sets = {"large": large}
    os.makedirs(out, exist_ok=True)
    for name, fn in sets.items():
        d = os.path.join(out, name)
        stamp = os.path.join(out, f".{name}-complete-{VERSION}")
        if os.path.exists(stamp):
            continue
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        fn(d)
        open(stamp, "w").close()
        print(f"made {d}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
