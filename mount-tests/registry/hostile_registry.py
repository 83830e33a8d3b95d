#!/usr/bin/env python3
"""A registry that misbehaves on purpose, for the hostile-registry tests.

    hostile_registry.py PORT OCI_LAYOUT

Serves the image of OCI_LAYOUT (its first manifest or index by tag, manifests by digest,
its blobs) under several repository names, each with one fault (the repository's first
component names it):

  good/img         the image as it is
  liar/img         a tag whose Docker-Content-Digest is not the hash of the bytes sent
  swapped/img      asked by digest, answers other bytes
  huge/img         a manifest that says it has 64 MiB
  endless/img      a manifest that never ends (chunked, no length)
  silent/img       never answers the manifest request
  loop/img         blobs redirect to themselves, forever
  tokenless/img    /v2/ wants a bearer token from a realm that never answers
  busy/img         429 with Retry-After: 1 on the first two manifest requests
  closed/img       503 with Retry-After: 3600
  tampered/img     the last layer's blob (of the image) with one byte flipped
  rangeless/img    blobs whole (200) whatever range is asked, as a server without ranges

For a SOCI-enabled layout (an index whose image manifest names its SOCI index by the
`com.amazon.soci.index-digest` annotation), three more:

  soci-missing/img the image manifest names a SOCI index that is not there
  soci-foreign/img it names a document that is not a SOCI index (the image's config)
  soci-ztoc/img    the zTOCs' bytes with one byte flipped (not their digests')

A request for several ranges at once (`Range: bytes=A-B,C-D`) is answered with the
whole blob (200), as servers that take one range only do: the client must fall back to
one range per request.

With PORT 0 the server binds a port of the system's choice and prints `PORT N` first.
Every request is then logged on stdout as `METHOD PATH STATUS RANGE` (RANGE: the Range
header without spaces, or `-`).
"""

import hashlib
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG_LOCK = threading.Lock()

PORT = int(sys.argv[1])
LAYOUT = sys.argv[2]
INDEX = json.load(open(os.path.join(LAYOUT, "index.json")))
TOP = INDEX["manifests"][0]


def blob(digest):
    alg, hexd = digest.split(":", 1)
    with open(os.path.join(LAYOUT, "blobs", alg, hexd), "rb") as f:
        return f.read()


MANIFEST = blob(TOP["digest"])
MANIFEST_TYPE = TOP.get("mediaType", "application/vnd.oci.image.manifest.v1+json")


def image_manifest(doc):
    """The image manifest of a manifest or of an index (its first image)."""
    if "layers" in doc:
        return doc
    for d in doc["manifests"]:
        if "com.amazon.soci.image-manifest-digest" not in d.get("annotations", {}):
            return image_manifest(json.loads(blob(d["digest"])))
    raise SystemExit("no image in the layout")


LAST_LAYER = image_manifest(json.loads(MANIFEST))["layers"][-1]["digest"]
SOCI_INDEX = "com.amazon.soci.index-digest"
# Documents served by digest besides the layout's, and the tag's document per fault.
EXTRA = {}
VARIANTS = {}
ZTOCS = set()


def soci_variant(target):
    """The top index with its image manifest naming `target` as its SOCI index."""
    top = json.loads(MANIFEST)
    for d in top["manifests"]:
        if "com.amazon.soci.image-manifest-digest" in d.get("annotations", {}):
            continue
        m = json.loads(blob(d["digest"]))
        m["annotations"][SOCI_INDEX] = target
        body = json.dumps(m).encode()
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        EXTRA[digest] = body
        d["digest"], d["size"] = digest, len(body)
    return json.dumps(top).encode()


_img = image_manifest(json.loads(MANIFEST))
if SOCI_INDEX in _img.get("annotations", {}):
    for z in json.loads(blob(_img["annotations"][SOCI_INDEX]))["layers"]:
        if "com.amazon.soci.image-layer-digest" in z.get("annotations", {}):
            ZTOCS.add(z["digest"])
    VARIANTS["soci-missing"] = soci_variant("sha256:" + "0" * 64)
    VARIANTS["soci-foreign"] = soci_variant(_img["config"]["digest"])
busy_count = {"n": 0}
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def log(self, status):
        rng = (self.headers.get("Range") or "-").replace(" ", "")
        # One write a line, under a lock: print() writes the text and its newline
        # separately, and the handlers run on threads of their own.
        with LOG_LOCK:
            sys.stdout.write(f"{self.command} {self.path} {status} {rng}\n")
            sys.stdout.flush()

    def send(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.log(status)

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/v2/":
            return self.send(200, b"{}")
        if path == "/token-hang":
            self.log("hang")
            time.sleep(3600)
            return
        parts = path.split("/")
        # /v2/FAULT/img/manifests/REF or /v2/FAULT/img/blobs/DIGEST
        if len(parts) < 6 or parts[1] != "v2":
            return self.send(404)
        fault, kind, ref = parts[2], parts[4], parts[5]
        if fault == "tokenless" and not self.headers.get("Authorization"):
            return self.send(401, b"", [("WWW-Authenticate",
                f'Bearer realm="http://127.0.0.1:{PORT}/token-hang",service="hostile"')])
        if kind == "manifests":
            return self.manifest(fault, ref)
        if kind == "blobs":
            return self.blob(fault, ref)
        return self.send(404)

    def manifest(self, fault, ref):
        if ref.startswith("sha256:") and fault != "swapped":
            # A child of an index, by digest, as a registry serves it.
            try:
                body = EXTRA[ref] if ref in EXTRA else blob(ref)
            except (OSError, ValueError):
                return self.send(404)
            kind = json.loads(body).get("mediaType", "application/vnd.oci.image.manifest.v1+json")
            return self.send(200, body, [("Content-Type", kind), ("Docker-Content-Digest", ref)])
        body = VARIANTS.get(fault, MANIFEST)
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        headers = [("Content-Type", MANIFEST_TYPE), ("Docker-Content-Digest", digest)]
        if fault == "liar":
            headers[1] = ("Docker-Content-Digest", "sha256:" + "1" * 64)
        elif fault == "swapped" and ref.startswith("sha256:"):
            body = body.replace(b"{", b"{ ", 1)
        elif fault == "huge":
            self.send_response(200)
            self.send_header("Content-Type", MANIFEST_TYPE)
            self.send_header("Content-Length", str(64 << 20))
            self.end_headers()
            self.log("huge")
            try:
                while True:
                    self.wfile.write(b" " * 65536)
            except OSError:
                return
        elif fault == "endless":
            self.send_response(200)
            self.send_header("Content-Type", MANIFEST_TYPE)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.log("endless")
            chunk = b" " * 65536
            try:
                while True:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except OSError:
                return
        elif fault == "silent":
            self.log("silent")
            time.sleep(3600)
            return
        elif fault == "busy":
            with lock:
                busy_count["n"] += 1
                n = busy_count["n"]
            if n <= 2:
                return self.send(429, b"", [("Retry-After", "1")])
        elif fault == "closed":
            return self.send(503, b"", [("Retry-After", "3600")])
        self.send(200, body, headers)

    def blob(self, fault, digest):
        if fault == "loop":
            return self.send(307, b"", [("Location", self.path)])
        try:
            data = blob(digest)
        except (OSError, ValueError):
            return self.send(404)
        if (fault == "tampered" and digest == LAST_LAYER) or (
                fault == "soci-ztoc" and digest in ZTOCS):
            data = bytearray(data)
            data[len(data) // 2] ^= 0x55
            data = bytes(data)
        rng = self.headers.get("Range")
        if fault == "rangeless" or (rng and "," in rng):
            return self.send(200, data)
        if rng and rng.startswith("bytes="):
            a, b = rng[6:].split("-")
            a, b = int(a), min(int(b), len(data) - 1)
            return self.send(206, data[a:b + 1],
                             [("Content-Range", f"bytes {a}-{b}/{len(data)}")])
        self.send(200, data)


class Server(ThreadingHTTPServer):
    daemon_threads = True


srv = Server(("127.0.0.1", PORT), Handler)
PORT = srv.server_address[1]  # the realm of tokenless/img names it
print(f"PORT {PORT}", flush=True)
srv.serve_forever()
