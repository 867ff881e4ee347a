#!/usr/bin/env python3
"""A server for the trace-context tests that tells what trace context it got.

  trace_server.py --port N                       plain HTTP/1.1 (http.server)
  trace_server.py --port N --h2 --cert C --key K HTTP/2 over TLS (the h2
                                                 package over Python's ssl)

Every request (any method, any path) is answered 200 with a JSON body:
{"traceparent": ..., "tracestate": ..., "path": ...} as the request carried
them (null when absent), so that the client can show that the headers
reached the server unchanged. Keep-alive. Prints "PORT <n>" once listening;
serves until killed. The h2 mode needs the h2 package (tests/src/lib.rs:
`trace_context_python`).
"""
import argparse
import json
import socket
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def answer(headers, path):
    """The JSON body that tells what arrived."""
    return json.dumps({
        "traceparent": headers.get("traceparent"),
        "tracestate": headers.get("tracestate"),
        "path": path,
    }).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def handle_one(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        body = answer({k.lower(): v for k, v in self.headers.items()}, self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = handle_one
    do_POST = handle_one

    def log_message(self, *args):
        pass


def serve_h2(conn, ctx):
    import h2.config
    import h2.connection
    import h2.events

    try:
        s = ctx.wrap_socket(conn, server_side=True)
    except (OSError, ssl.SSLError):
        conn.close()
        return
    h2c = h2.connection.H2Connection(
        config=h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
    h2c.initiate_connection()
    s.sendall(h2c.data_to_send())
    requests = {}
    try:
        while True:
            data = s.recv(65536)
            if not data:
                break
            for ev in h2c.receive_data(data):
                if isinstance(ev, h2.events.RequestReceived):
                    requests[ev.stream_id] = dict(ev.headers)
                elif isinstance(ev, h2.events.DataReceived):
                    h2c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.StreamEnded):
                    headers = requests.pop(ev.stream_id, {})
                    body = answer(headers, headers.get(":path"))
                    h2c.send_headers(ev.stream_id, [
                        (":status", "200"),
                        ("content-type", "application/json"),
                        ("content-length", str(len(body))),
                    ])
                    h2c.send_data(ev.stream_id, body, end_stream=True)
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    break
            out = h2c.data_to_send()
            if out:
                s.sendall(out)
    except (OSError, ssl.SSLError):
        pass
    finally:
        s.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--h2", action="store_true")
    ap.add_argument("--cert")
    ap.add_argument("--key")
    a = ap.parse_args()
    if not a.h2:
        httpd = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
        print("PORT", httpd.server_address[1], flush=True)
        httpd.serve_forever()
        return
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(a.cert, a.key)
    ctx.set_alpn_protocols(["h2"])
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", a.port))
    ls.listen(64)
    print("PORT", ls.getsockname()[1], flush=True)
    while True:
        conn, _ = ls.accept()
        threading.Thread(target=serve_h2, args=(conn, ctx), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
