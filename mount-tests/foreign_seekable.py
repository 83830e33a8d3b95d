#!/usr/bin/env python3
"""Write a seekable tar.zst the way other tools do, with pyzstd (from PyPI).

    foreign_seekable.py SRC_DIR OUT [FRAME_SIZE]

The tar stream comes from Python's `tarfile` (pax format), compressed by
`pyzstd.SeekableZstdFile` into frames of at most FRAME_SIZE bytes (default 64 KiB),
with pyzstd's own seek table and no pkgfs index: pkgfs must index it by scanning.
"""

import os
import sys
import tarfile

import pyzstd


def main(argv):
    src, out = argv[0], argv[1]
    frame = int(argv[2]) if len(argv) > 2 else 64 * 1024
    with pyzstd.SeekableZstdFile(out, "w", max_frame_content_size=frame) as z:
        with tarfile.open(fileobj=z, mode="w", format=tarfile.PAX_FORMAT) as t:
            for name in sorted(os.listdir(src)):
                t.add(os.path.join(src, name), arcname=name, recursive=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
