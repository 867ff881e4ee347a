#!/usr/bin/env python3
"""An OTLP/HTTP receiver over TLS for the tests: accepts POSTs (any path) and
answers 200. Prints "PORT <n>" once listening (and nothing after: the test
stops reading its output)."""
import argparse
import http.server
import ssl
import sys


class Handler(http.server.BaseHTTPRequestHandler):
    # Keep-alive: an HTTP/1.0 handler closes the TLS connection without a
    # close_notify, which rustls clients rightly report as an error.
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(n)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cert")
    ap.add_argument("--key")
    a = ap.parse_args()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(a.cert, a.key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    print("PORT", srv.server_address[1], flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
