#!/usr/bin/env python3
"""An OCI layout whose layers are uncompressed tars, from one with gzip layers.

    uncompressed.py FROM_LAYOUT TO_LAYOUT

skopeo 1.9 keeps a layer's media type when asked to decompress it, so the copy is made
here: each layer decompressed, its descriptor `application/vnd.oci.image.layer.v1.tar`
(its digest and size the tar's, which are the config's `diff_ids`), the config as it
is, and a new manifest and index (tag `latest`).
"""

import gzip
import hashlib
import json
import os
import shutil
import sys

src, dst = sys.argv[1], sys.argv[2]


def read(digest):
    with open(os.path.join(src, "blobs", *digest.split(":", 1)), "rb") as f:
        return f.read()


def write(data):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    path = os.path.join(dst, "blobs", "sha256", digest[7:])
    with open(path, "wb") as f:
        f.write(data)
    return digest


shutil.rmtree(dst, ignore_errors=True)
os.makedirs(os.path.join(dst, "blobs", "sha256"))
top = json.load(open(os.path.join(src, "index.json")))["manifests"][0]
manifest = json.loads(read(top["digest"]))
write(read(manifest["config"]["digest"]))
for layer in manifest["layers"]:
    tar = gzip.decompress(read(layer["digest"]))
    layer.update(mediaType="application/vnd.oci.image.layer.v1.tar", digest=write(tar),
                 size=len(tar))
body = json.dumps(manifest).encode()
desc = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": write(body),
        "size": len(body), "annotations": {"org.opencontainers.image.ref.name": "latest"}}
with open(os.path.join(dst, "index.json"), "w") as f:
    json.dump({"schemaVersion": 2, "manifests": [desc]}, f)
with open(os.path.join(dst, "oci-layout"), "w") as f:
    json.dump({"imageLayoutVersion": "1.0.0"}, f)
