#!/usr/bin/env python3
"""A thread-per-request HTTP proxy for the proxy tests (the standard
library's ThreadingHTTPServer): GET /api/<rest> is forwarded as GET /<rest>
(a path the request match cannot tie) on a new connection to the backend,
after --own-ms of its own work, and answered with the backend's body.

  thread_proxy.py --port PORT --backend PORT [--own-ms N] --log FILE

Each request appends "<path> <request_ms> <leg_ms>" to FILE: its own clock
from the handler's start to its answer written, and around the upstream
call (connect, request, answer read). Prints "PORT <n>" once listening.
"""
import argparse
import http.client
import http.server
import sys
import threading
import time


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    backend = 0
    own = 0.0
    log = None
    lock = threading.Lock()

    def do_GET(self):
        t0 = time.monotonic()
        time.sleep(self.own)
        rest = self.path[len("/api"):] if self.path.startswith("/api/") else self.path
        t_leg = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", self.backend)
        conn.request("GET", rest)
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        leg_ms = (time.monotonic() - t_leg) * 1e3
        self.send_response(resp.status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        request_ms = (time.monotonic() - t0) * 1e3
        with self.lock:
            with open(self.log, "a") as f:
                f.write(f"{self.path} {request_ms:.3f} {leg_ms:.3f}\n")

    def log_message(self, *args):
        pass


class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 128
    daemon_threads = True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--backend", type=int, required=True)
    p.add_argument("--own-ms", type=float, default=0.0)
    p.add_argument("--log", required=True)
    a = p.parse_args()
    Handler.backend = a.backend
    Handler.own = a.own_ms / 1000.0
    Handler.log = a.log
    server = Server(("127.0.0.1", a.port), Handler)
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
