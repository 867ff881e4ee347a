"""A minimal SMTP server that turns to TLS on STARTTLS (RFC 3207), for
clients such as `curl --ssl-reqd smtp://...`: plaintext greeting and EHLO,
then the TLS handshake on the same connection, then the rest of the
conversation inside it. Prints "PORT <n>" once it listens."""

import argparse
import socket
import ssl
import threading


def lines(conn):
    buf = b""
    while True:
        while b"\r\n" not in buf:
            data = conn.recv(4096)
            if not data:
                return
            buf += data
        line, buf = buf.split(b"\r\n", 1)
        yield line.decode(errors="replace")


def converse(conn, tls_context):
    """Answers commands; `tls_context` is None once inside TLS."""
    for line in lines(conn):
        verb = line.split(" ", 1)[0].upper()
        if verb in ("EHLO", "HELO"):
            offer = b"STARTTLS" if tls_context else b"HELP"
            conn.sendall(b"250-test\r\n250 " + offer + b"\r\n")
        elif verb == "STARTTLS" and tls_context:
            conn.sendall(b"220 go ahead\r\n")
            return converse(tls_context.wrap_socket(conn, server_side=True), None)
        elif verb == "QUIT":
            conn.sendall(b"221 bye\r\n")
            return
        else:
            conn.sendall(b"530 STARTTLS first\r\n" if tls_context else b"214 help\r\n")


def serve(conn, tls_context):
    try:
        conn.sendall(b"220 test ESMTP\r\n")
        converse(conn, tls_context)
    except (OSError, ssl.SSLError):
        pass
    finally:
        conn.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    a = p.parse_args()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(a.cert, a.key)
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    print(f"PORT {srv.getsockname()[1]}", flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn, ctx), daemon=True).start()


main()
