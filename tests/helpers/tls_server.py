#!/usr/bin/env python3
"""An HTTP/1.1 server over TLS (Python's ssl, i.e. OpenSSL) for the TLS tests.

Injects known delays: --handshake-delay-ms inside the handshake (in the
server-name callback, which OpenSSL runs for every ClientHello) and
--answer-delay-ms between reading a request and answering it. Keep-alive:
answers every request on a connection until the client closes.

--mode plain serves the same without TLS (a backend for nginx);
--mode close-on-hello reads the first bytes of the ClientHello and closes.
Prints "PORT <n>" once listening; serves until killed.
"""
import argparse
import socket
import ssl
import sys
import threading
import time


def response(body_bytes):
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % body_bytes
    return head + b"x" * body_bytes


def serve_http(s, delay, body_bytes):
    buf = b""
    while True:
        data = s.recv(65536)
        if not data:
            return
        buf += data
        while b"\r\n\r\n" in buf:
            _, buf = buf.split(b"\r\n\r\n", 1)
            time.sleep(delay)
            s.sendall(response(body_bytes))


def serve(conn, ctx, a):
    with conn:
        try:
            if a.mode == "close-on-hello":
                conn.recv(10)
                return
            if a.mode == "plain":
                serve_http(conn, a.answer_delay_ms / 1000.0, a.body_bytes)
                return
            with ctx.wrap_socket(conn, server_side=True) as s:
                serve_http(s, a.answer_delay_ms / 1000.0, a.body_bytes)
        except (OSError, ssl.SSLError):
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--handshake-delay-ms", type=float, default=0.0)
    ap.add_argument("--answer-delay-ms", type=float, default=0.0)
    ap.add_argument("--body-bytes", type=int, default=5)
    ap.add_argument("--mode", choices=["tls", "plain", "close-on-hello"], default="tls")
    a = ap.parse_args()
    ctx = None
    if a.mode == "tls":
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(a.cert, a.key)
        delay = a.handshake_delay_ms / 1000.0
        ctx.sni_callback = lambda sock, name, c: time.sleep(delay)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", a.port))
    s.listen(1024)
    print("PORT", s.getsockname()[1], flush=True)
    while True:
        conn, _ = s.accept()
        threading.Thread(target=serve, args=(conn, ctx, a), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
