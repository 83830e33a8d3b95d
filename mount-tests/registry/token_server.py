#!/usr/bin/env python3
"""A bearer token server for the registry tests, as Docker Hub's and GHCR's work.

    token_server.py PORT KEY.pem CERT.pem ISSUER USER:PASS [LIFETIME_S]

Serves `GET /token?service=S&scope=repository:NAME:ACTIONS` (the distribution token
spec), and its OAuth2 form (`POST /token`, `grant_type=password`, as containerd asks
when it holds credentials): with `Authorization: Basic` of USER:PASS the answer is a JWT (RS256, the signing
certificate in the `x5c` header, which the registry checks against its
`rootcertbundle`) granting the actions asked for; wrong credentials get 401; no
credentials get a token that grants nothing (anonymous, as Docker Hub does for private
repositories). Each request is logged on stdout as `TOKEN <user|-> <scope> <status>`,
so a test counts the tokens a client asked for; with PORT 0 the port the system gave is
the first line, `PORT N`. Uses `cryptography` (a dependency of
moto, in the tests' Python).
"""

import base64
import json
import sys
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding


def b64url(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def main():
    port, key_path, cert_path, issuer, creds = sys.argv[1:6]
    lifetime = int(sys.argv[6]) if len(sys.argv) > 6 else 300
    with open(key_path, "rb") as f:
        key = serialization.load_pem_private_key(f.read(), None)
    with open(cert_path, "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
    user, _, password = creds.partition(":")

    def token(service, access):
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "x5c": [x5c]}
        claims = {
            "iss": issuer,
            "sub": user,
            "aud": service,
            "exp": now + lifetime,
            "nbf": now - 10,
            "iat": now,
            "jti": uuid.uuid4().hex,
            "access": access,
        }
        signing = b64url(json.dumps(header).encode()) + "." + b64url(json.dumps(claims).encode())
        sig = key.sign(signing.encode(), padding.PKCS1v15(), hashes.SHA256())
        return signing + "." + b64url(sig)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            u = urlparse(self.path)
            q = parse_qs(u.query)
            given = None
            auth = self.headers.get("Authorization", "")
            if auth.startswith("Basic "):
                try:
                    given = base64.b64decode(auth[6:]).decode()
                except Exception:
                    given = ""
            self.grant(given, q.get("scope", []), q.get("service", [""])[0])

        def do_POST(self):
            # The OAuth2 form of the spec (containerd's and docker's first try when they
            # hold credentials): grant_type=password with username and password, scopes
            # space-separated.
            n = int(self.headers.get("Content-Length") or 0)
            form = parse_qs(self.rfile.read(n).decode(errors="replace"))
            given = None
            if form.get("grant_type", [""])[0] == "password":
                given = f"{form.get('username', [''])[0]}:{form.get('password', [''])[0]}"
            scopes = " ".join(form.get("scope", [])).split()
            self.grant(given, scopes, form.get("service", [""])[0])

        def grant(self, given, scopes, service):
            """A token for `scopes`: everything asked with the right USER:PASS
            (`given`), nothing without credentials, 401 with wrong ones."""
            who = "-"
            ok = False
            if given is not None:
                who = given.partition(":")[0] or "-"
                ok = given == f"{user}:{password}"
                if not ok:
                    self.answer(401, {"details": "incorrect username or password"}, who, scopes)
                    return
            access = []
            if ok:
                for s in scopes:
                    parts = s.split(":")
                    if len(parts) == 3:
                        access.append(
                            {"type": parts[0], "name": parts[1], "actions": parts[2].split(",")}
                        )
            t = token(service, access)
            self.answer(
                200,
                {"token": t, "access_token": t, "expires_in": lifetime,
                 "issued_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                who,
                scopes,
            )

        def answer(self, status, body, who, scopes):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            print(f"TOKEN {who} {' '.join(scopes) or '-'} {status}", flush=True)

    srv = ThreadingHTTPServer(("127.0.0.1", int(port)), Handler)
    # PORT 0: the system's choice, reported for the test to read.
    print(f"PORT {srv.server_address[1]}", flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
