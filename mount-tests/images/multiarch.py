#!/usr/bin/env python3
"""A multi-platform OCI image layout, as `skopeo copy --all` writes one.

    multiarch.py OUTDIR

index.json tags `latest` as an image index of three images, linux/amd64, linux/arm64/v8
and linux/s390x, each one gzip layer holding /platform (its os/arch) and a shared
/common.txt. A second tag, `amd64-only`, names the amd64 manifest directly. Standard
library only (the Layout helper of hostile.py).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile  # noqa: E402

PLATFORMS = [("linux", "amd64", None), ("linux", "arm64", "v8"), ("linux", "s390x", None)]


def main(argv):
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    lay = hostile.Layout(argv[0])
    manifests = []
    for os_, arch, variant in PLATFORMS:
        name = f"{os_}/{arch}" + (f"/{variant}" if variant else "")
        t = hostile.tar([("platform", "file", name + "\n"), ("common.txt", "file", "shared\n")])
        layer = lay.blob(hostile.gz(t), hostile.MT_GZIP)
        cfg = lay.json_blob(dict(
            architecture=arch, os=os_, **({"variant": variant} if variant else {}),
            rootfs=dict(type="layers", diff_ids=[hostile.sha(t)])), hostile.MT_CONFIG)
        m = lay.manifest(cfg, [layer])
        platform = dict(os=os_, architecture=arch)
        if variant:
            platform["variant"] = variant
        manifests.append(dict(m, platform=platform))
    index = lay.json_blob(dict(schemaVersion=2, mediaType=hostile.MT_INDEX, manifests=manifests),
                          hostile.MT_INDEX)
    top = [dict(index, annotations={hostile.REF: "latest"}),
           dict({k: manifests[0][k] for k in ("mediaType", "digest", "size")},
                annotations={hostile.REF: "amd64-only"})]
    import json
    with open(os.path.join(argv[0], "index.json"), "w") as f:
        json.dump(dict(schemaVersion=2, mediaType=hostile.MT_INDEX, manifests=top), f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
