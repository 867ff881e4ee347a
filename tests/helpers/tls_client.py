#!/usr/bin/env python3
"""A TLS client (Python's ssl, i.e. OpenSSL) that times itself.

Makes --requests HTTP/1.1 requests on one keep-alive connection. With
--wait-for FILE it first imports ssl (libssl is then mapped), prints
"WAITING", and connects only once FILE exists (a client that started before
the observer). Prints one JSON line: its pid, handshake time (wrap_socket),
per-request time from the request's send to the first response byte, and
plaintext byte totals, as this process measured them.
"""
import argparse
import json
import os
import socket
import ssl
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--servername", default=None)
    ap.add_argument("--requests", type=int, default=1)
    ap.add_argument("--body-bytes", type=int, default=5)
    ap.add_argument("--wait-for", default=None)
    a = ap.parse_args()
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if a.wait_for:
        print("WAITING", flush=True)
        while not os.path.exists(a.wait_for):
            time.sleep(0.01)
    raw = socket.create_connection(("127.0.0.1", a.port))
    t = time.perf_counter()
    s = ctx.wrap_socket(raw, server_hostname=a.servername)
    handshake = time.perf_counter() - t
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % a.body_bytes
    want = len(head) + a.body_bytes
    ttfb, sent, received = [], 0, 0
    for i in range(a.requests):
        req = b"GET /%d HTTP/1.1\r\nHost: test\r\n\r\n" % i
        t = time.perf_counter()
        s.sendall(req)
        sent += len(req)
        got = s.recv(65536)
        ttfb.append((time.perf_counter() - t) * 1000)
        n = len(got)
        while n < want:
            n += len(s.recv(65536))
        received += n
    s.close()
    print(json.dumps({
        "pid": os.getpid(),
        "handshake_ms": handshake * 1000,
        "ttfb_ms": ttfb,
        "sent": sent,
        "received": received,
    }), flush=True)


if __name__ == "__main__":
    sys.exit(main())
