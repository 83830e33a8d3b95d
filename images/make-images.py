#!/usr/bin/env python3
"""Make the sample packages in images/ that the README's demo mounts.

    python3 images/make-images.py        # rewrites images/*.zip, *.whl, *.jar

Three small packages, as a package directory would hold them:

  10-hello.zip       a pure-Python package `hello` (import it from the mount)
  20-tools-1.0-py3-none-any.whl
                     a wheel: `tools` with its .dist-info, deflated
  30-docs.jar        a jar-named zip (found by content) with docs and a symlink

`share/VERSION` is in both 10-hello.zip and 30-docs.jar: the later layer (30-docs.jar,
by byte order of names) wins, which the demo shows. The output is deterministic (fixed
times, sorted entries), so re-running gives byte-identical files.

Demo:  pkgfs mount images /mnt && python3 -c 'import sys; sys.path.insert(0, "/mnt");
       import hello; hello.greet()' && cat /mnt/share/VERSION && pkgfs umount /mnt
"""

import os
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
WHEN = (2024, 1, 2, 3, 4, 6)


def add(z, name, data, mode=0o644, method=zipfile.ZIP_DEFLATED):
    info = zipfile.ZipInfo(name, WHEN)
    info.create_system = 3
    info.compress_type = method
    kind = 0o040000 if name.endswith("/") else 0o100000
    info.external_attr = ((kind | mode) << 16) | (0x10 if name.endswith("/") else 0)
    z.writestr(info, data)


def link(z, name, target):
    info = zipfile.ZipInfo(name, WHEN)
    info.create_system = 3
    info.external_attr = (0o120777 << 16)
    z.writestr(info, target)


def make(name, entries):
    path = os.path.join(HERE, name)
    with zipfile.ZipFile(path, "w") as z:
        for e in sorted(entries, key=lambda e: e[1]):
            e[0](z, *e[1:])


def main():
    make("10-hello.zip", [
        (add, "hello/", b"", 0o755),
        (add, "hello/__init__.py",
         b'"""A package imported straight from a pkgfs mount."""\n\n'
         b"def greet(name='pkgfs'):\n    print(f'hello from {name}, read without extraction')\n"),
        (add, "share/VERSION", b"1.0 (from 10-hello.zip)\n"),
    ])
    make("20-tools-1.0-py3-none-any.whl", [
        (add, "tools/__init__.py", b"from .cli import main\n"),
        (add, "tools/cli.py", b"def main():\n    print('tools 1.0')\n"),
        (add, "tools-1.0.dist-info/METADATA",
         b"Metadata-Version: 2.1\nName: tools\nVersion: 1.0\nSummary: sample wheel for pkgfs\n"),
        (add, "tools-1.0.dist-info/WHEEL",
         b"Wheel-Version: 1.0\nGenerator: make-images.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
        (add, "tools-1.0.dist-info/RECORD",
         b"tools/__init__.py,,\ntools/cli.py,,\ntools-1.0.dist-info/METADATA,,\n"
         b"tools-1.0.dist-info/WHEEL,,\ntools-1.0.dist-info/RECORD,,\n"),
    ])
    make("30-docs.jar", [
        (add, "docs/README.txt", b"These docs live in 30-docs.jar.\n" * 20),
        (add, "docs/guide/intro.txt", b"pkgfs merges every archive into one tree.\n", 0o644, zipfile.ZIP_STORED),
        (link, "docs/latest", "guide/intro.txt"),
        (add, "share/VERSION", b"1.1 (from 30-docs.jar, the later layer wins)\n"),
    ])


if __name__ == "__main__":
    main()
