#!/usr/bin/env python3
"""Opens --connections concurrent TCP connections to HOST PORT, sends a short
request on each, reads the reply to EOF. Prints "PID <pid>" and, per
connection, "LOCAL <port>"."""
import argparse
import os
import socket
import threading


def one(host, port, out, lock):
    s = socket.create_connection((host, port))
    local = s.getsockname()[1]
    s.sendall(b"hello")
    while s.recv(65536):
        pass
    s.close()
    with lock:
        out.append(local)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--connections", type=int, default=50)
    a = ap.parse_args()
    out, lock = [], threading.Lock()
    barrier = threading.Barrier(a.connections)

    def run():
        barrier.wait()
        one(a.host, a.port, out, lock)

    ts = [threading.Thread(target=run) for _ in range(a.connections)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print("PID", os.getpid())
    for p in out:
        print("LOCAL", p)


if __name__ == "__main__":
    main()
