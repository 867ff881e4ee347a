#!/usr/bin/env python3
"""An HTTP/1.1 backend for the proxy tests: keep-alive, one thread per
connection, every answer after --delay-ms, its body naming the path.

  delay_backend.py [--delay-ms N] [--tls CERT KEY]

Prints "PORT <n>" once listening; serves until killed.
"""
import argparse
import http.server
import ssl
import sys
import time


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    delay = 0.0

    def do_GET(self):
        time.sleep(self.delay)
        body = ("served " + self.path + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Server(http.server.ThreadingHTTPServer):
    # A production server's accept queue (nginx: 511), not Python's 5: with
    # 5, concurrent connects overflow it and the kernel creates the socket
    # from a segment that already carries the request (see bench/NOTES.md,
    # "a request in the segment that completes the handshake").
    request_queue_size = 128
    daemon_threads = True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    a = p.parse_args()
    Handler.delay = a.delay_ms / 1000.0
    server = Server(("127.0.0.1", 0), Handler)
    if a.tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(a.tls[0], a.tls[1])
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
