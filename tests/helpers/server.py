#!/usr/bin/env python3
"""A TCP server for the end-to-end tests.

Prints "PORT <n>" once listening. For each connection: reads one request (one
recv), waits --delay-ms, sends --response-bytes bytes, closes. Serves
connections concurrently until killed (or --count connections were served).
"""
import argparse
import socket
import sys
import threading
import time


def serve(conn, delay, size):
    with conn:
        try:
            if not conn.recv(65536):
                return
            time.sleep(delay)
            conn.sendall(b"x" * size)
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--response-bytes", type=int, default=100)
    ap.add_argument("--count", type=int, default=0)
    a = ap.parse_args()
    family = socket.AF_INET6 if ":" in a.host else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((a.host, a.port))
    s.listen(1024)
    print("PORT", s.getsockname()[1], flush=True)
    served = 0
    threads = []
    while a.count == 0 or served < a.count:
        conn, _ = s.accept()
        t = threading.Thread(target=serve, args=(conn, a.delay_ms / 1000.0, a.response_bytes))
        t.start()
        threads.append(t)
        served += 1
    for t in threads:
        t.join()


if __name__ == "__main__":
    sys.exit(main())
