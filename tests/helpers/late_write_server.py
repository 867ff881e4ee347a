"""An HTTPS server whose answer's SSL_write returns late.

  LD_PRELOAD=late_write.so LATE_WRITE_MS=80 LATE_WRITE_MIN=4096 \
      late_write_server.py --cert C --key K --body-bytes N

Each connection: one request read, one answer (Connection: close, N bytes
of body) sent in one SSL_write, whose bytes leave at once but whose call
returns LATE_WRITE_MS later (late_write.c). A second thread closes the
connection as soon as the client has closed its end, so the close comes
before the write's return: what a Go server's reader goroutine does
beside its writer on a loaded host. Prints "PORT <n>" once it listens.
"""

import argparse
import os
import select
import socket
import ssl
import threading


def close_when_the_client_has(fd):
    select.select([fd], [], [])
    # The descriptor itself, as Go's reader goroutine closes its conn: the
    # socket goes while the write's call has not returned.
    os.close(fd)


def serve(s, body):
    asked = b""
    while b"\r\n\r\n" not in asked:
        got = s.recv(65536)
        if not got:
            s.close()
            return
        asked += got
    closer = threading.Thread(target=close_when_the_client_has, args=(s.fileno(),))
    closer.start()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
    s.sendall(head % len(body) + body)
    closer.join()
    # Closed by the other thread already: not again (its number may be
    # another file's by now).
    s.detach()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--body-bytes", type=int, required=True)
    a = p.parse_args()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(a.cert, a.key)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    print("PORT", srv.getsockname()[1], flush=True)
    body = b"x" * a.body_bytes
    while True:
        conn, _ = srv.accept()
        serve(ctx.wrap_socket(conn, server_side=True), body)


main()
