#!/usr/bin/env python3
"""A TLS client (Python's ssl, i.e. OpenSSL) that times itself.

Makes --connections connections one after another (--pause-ms between), each
with --requests HTTP/1.1 requests on one keep-alive connection; --plain sends
the first request without TLS (a wrong-protocol client). With --wait-for FILE
it first imports ssl (libssl is then mapped), prints "WAITING", and connects
only once FILE exists (a client that started before the observer).

Prints one JSON line per connection: this process's pid, local port, the
handshake time (wrap_socket, from TCP connected), the time from each
request's send to the first response byte, and plaintext byte totals, as this
process measured them.
"""
import argparse
import json
import os
import socket
import ssl
import sys
import time


def read_response(s):
    """Reads one HTTP response (headers + Content-Length body); returns
    (time to the first byte's arrival is measured by the caller, bytes)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            return buf
        buf += d
    head, body = buf.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    while len(body) < length:
        d = s.recv(65536)
        if not d:
            break
        body += d
    return head + b"\r\n\r\n" + body


def one(a, ctx):
    began = time.perf_counter()
    raw = socket.create_connection(("127.0.0.1", a.port))
    local_port = raw.getsockname()[1]
    if a.plain:
        raw.sendall(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
        try:
            raw.recv(65536)
        except ConnectionResetError:
            pass  # the TLS server gave up on us: expected
        raw.close()
        return {"pid": os.getpid(), "local_port": local_port}
    t = time.perf_counter()
    s = ctx.wrap_socket(raw, server_hostname=a.servername)
    handshake = time.perf_counter() - t
    # From before the connect: a clock that holds any span from the
    # connection's establishment to the handshake's end.
    connect_and_handshake = time.perf_counter() - began
    ttfb, sent, received = [], 0, 0
    for i in range(a.requests):
        req = b"GET /%d HTTP/1.1\r\nHost: test\r\n\r\n" % i
        t = time.perf_counter()
        s.sendall(req)
        sent += len(req)
        first = s.recv(65536)
        ttfb.append((time.perf_counter() - t) * 1000)

        class Prefixed:
            def __init__(self):
                self.pending = first

            def recv(self, n):
                if self.pending:
                    d, self.pending = self.pending, b""
                    return d
                return s.recv(n)

        received += len(read_response(Prefixed()))
    s.close()
    return {
        "pid": os.getpid(),
        "local_port": local_port,
        "handshake_ms": handshake * 1000,
        "connect_and_handshake_ms": connect_and_handshake * 1000,
        "ttfb_ms": ttfb,
        "sent": sent,
        "received": received,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--servername", default=None)
    ap.add_argument("--requests", type=int, default=1)
    ap.add_argument("--connections", type=int, default=1)
    ap.add_argument("--pause-ms", type=float, default=0)
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--wait-for", default=None)
    a = ap.parse_args()
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if a.wait_for:
        print("WAITING", flush=True)
        while not os.path.exists(a.wait_for):
            time.sleep(0.01)
    for i in range(a.connections):
        if i:
            time.sleep(a.pause_ms / 1000)
        print(json.dumps(one(a, ctx)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
