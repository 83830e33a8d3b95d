#!/usr/bin/env python3
"""A small HTTP proxy that adds faults in front of a real server (nginx, moto).

    faultproxy.py PORT UPSTREAM_PORT CONTROL_FILE

Listens on 127.0.0.1:PORT and forwards every request (method, path, headers, body) to
127.0.0.1:UPSTREAM_PORT, streaming the answer back. Before each request it reads
CONTROL_FILE (JSON, may be missing or empty) for what to do to it:

    {"delay_ms": 20,      # wait this long before forwarding (latency)
     "fail_every": 3,     # answer every 3rd request with "status" instead of forwarding
     "status": 503,       # the status of those answers (default 503)
     "reset_every": 0,    # close the connection without an answer on every Nth request
     "refuse_first": 2,   # per path, the first 2 requests that have no Authorization
                          # header (a signed URL's) get "refuse_status": a URL not
                          # valid yet everywhere
     "expire_s": 3,       # and so does one whose X-Amz-Date is over 3 s old: expired,
                          # as S3 refuses a presigned URL past its X-Amz-Expires
     "refuse_status": 403,  # (default 403)
     "single_range": true}  # forward a request for several ranges without its Range
                            # header: the whole object (200), as servers that take one
                            # range only answer

It appends one line per request to CONTROL_FILE + ".log": "METHOD PATH STATUS BYTES",
BYTES being the body bytes it sent, and one to CONTROL_FILE + ".auth": "METHOD PATH
SCHEME", SCHEME being that of the request's Authorization header or "-" without one,
and, for a request with a Range header, one to CONTROL_FILE + ".ranges": "PATH RANGE
STATUS" (RANGE without spaces; STATUS the answer's). A client that leaves before the whole body is sent is logged with
the status "aborted" and 0 bytes. With PORT 0 it binds a port of the system's choice
and prints `PORT N` on stdout. Stops on SIGTERM.
"""

import calendar
import http.client
import http.server
import json
import socket
import sys
import threading
import time
import urllib.parse

PORT, UPSTREAM, CONTROL = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
LOG = CONTROL + ".log"
lock = threading.Lock()
count = 0
unsigned = {}
HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
       "trailer", "upgrade"}


def control():
    try:
        with open(CONTROL) as f:
            return json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return {}


def expired(query, max_age):
    """Whether a presigned URL's query was signed (X-Amz-Date) over max_age s ago."""
    signed = urllib.parse.parse_qs(query).get("X-Amz-Date")
    if not signed:
        return False
    try:
        t = calendar.timegm(time.strptime(signed[0], "%Y%m%dT%H%M%SZ"))
    except ValueError:
        return False
    return time.time() - t > max_age


def log(line):
    with lock, open(LOG, "a") as f:
        f.write(line + "\n")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def handle_one(self):
        global count
        c = control()
        with lock:
            count += 1
            n = count
        auth = self.headers.get("Authorization")
        path, _, query = self.path.partition("?")
        with lock, open(CONTROL + ".auth", "a") as f:
            f.write(f"{self.command} {path} {auth.split(' ', 1)[0] if auth else '-'}\n")
        if (c.get("expire_s") or c.get("refuse_first")) and not auth:
            with lock:
                unsigned[path] = n_path = unsigned.get(path, 0) + 1
            refuse = n_path <= c.get("refuse_first", 0) or (
                c.get("expire_s") and expired(query, c["expire_s"]))
            if refuse:
                status = c.get("refuse_status", 403)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()
                log(f"{self.command} {self.path} {status} 0")
                return
        if c.get("delay_ms"):
            time.sleep(c["delay_ms"] / 1000)
        if c.get("reset_every") and n % c["reset_every"] == 0:
            log(f"{self.command} {self.path} reset 0")
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        if c.get("fail_every") and n % c["fail_every"] == 0:
            status = c.get("status", 503)
            msg = b"injected fault\n"
            self.send_response(status)
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(msg)
            log(f"{self.command} {self.path} {status} 0")
            return
        up = http.client.HTTPConnection("127.0.0.1", UPSTREAM, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        rng = (self.headers.get("Range") or "").replace(" ", "")
        if c.get("single_range") and "," in rng:
            headers = {k: v for k, v in headers.items() if k.lower() != "range"}
        up.request(self.command, self.path, body=body, headers=headers)
        r = up.getresponse()
        if rng:
            with lock, open(CONTROL + ".ranges", "a") as f:
                f.write(f"{path} {rng} {r.status}\n")
        self.send_response(r.status, r.reason)
        for k, v in r.getheaders():
            if k.lower() not in HOP:
                self.send_header(k, v)
        try:
            sent = self.send_body(r)
        except (BrokenPipeError, ConnectionResetError):
            # The client left mid-body (a reader that had what it needed).
            up.close()
            self.close_connection = True
            log(f"{self.command} {self.path} aborted 0")
            return
        up.close()
        log(f"{self.command} {self.path} {r.status} {sent}")

    def send_body(self, r):
        """Streams upstream answer r to the client; returns the body bytes sent."""
        sent = 0
        if self.command == "HEAD" or r.status in (204, 304):
            self.end_headers()
        elif r.getheader("Content-Length") is not None:
            self.end_headers()
            while chunk := r.read(256 * 1024):
                self.wfile.write(chunk)
                sent += len(chunk)
        else:
            data = r.read()
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            sent = len(data)
        return sent

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = handle_one


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


if __name__ == "__main__":
    import signal
    srv = Server(("127.0.0.1", PORT), Handler)
    # PORT 0: the system's choice, reported on stdout for the test to read.
    print(f"PORT {srv.server_address[1]}", flush=True)
    signal.signal(signal.SIGTERM, lambda *a: threading.Thread(target=srv.shutdown).start())
    srv.serve_forever()
