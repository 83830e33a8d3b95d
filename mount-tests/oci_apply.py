#!/usr/bin/env python3
"""Apply image layers, each extracted to a directory, in order into TARGET the way an
OCI image unpacker does ("Representing Changes" in the OCI image layer spec): in each
layer, an opaque whiteout `.wh..wh..opq` first empties its directory of what the layers
below put there and a `.wh.NAME` removes NAME; then the layer's other entries are
copied over, keeping modes, symlink targets and modification times.

    oci_apply.py TARGET LAYERDIR...

An independent reference for `pkgfs mount --whiteouts`: it works on real directories
and shares no code with pkgfs. Layers must not replace a file by a directory or the
reverse (pkgfs's rule for that differs from an unpacker's).
"""

import os
import shutil
import stat
import sys

OPAQUE = ".wh..wh..opq"


def remove(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def apply(target, layer):
    for top, dirs, files in os.walk(layer):
        dest = os.path.join(target, os.path.relpath(top, layer))
        for name in dirs + files:
            if name == OPAQUE:
                if os.path.isdir(dest):
                    for child in os.listdir(dest):
                        remove(os.path.join(dest, child))
            elif name.startswith(".wh."):
                remove(os.path.join(dest, name[len(".wh."):]))
    dir_times = []
    for top, dirs, files in os.walk(layer):
        dest = os.path.join(target, os.path.relpath(top, layer))
        os.makedirs(dest, exist_ok=True)
        st = os.stat(top)
        os.chmod(dest, stat.S_IMODE(st.st_mode))
        dir_times.append((dest, st.st_mtime_ns))
        for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
            if name.startswith(".wh."):
                continue
            src, dst = os.path.join(top, name), os.path.join(dest, name)
            remove(dst)
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
                t = os.lstat(src).st_mtime_ns
                os.utime(dst, ns=(t, t), follow_symlinks=False)
            else:
                shutil.copy2(src, dst)
    for dest, t in reversed(dir_times):
        os.utime(dest, ns=(t, t))


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    os.makedirs(argv[0], exist_ok=True)
    for layer in argv[1:]:
        apply(argv[0], layer)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
