#!/usr/bin/env python3
"""A DNS server for the tests (UDP, one question per query).

Names starting with "nx" get NXDOMAIN, names starting with "drop" no answer at
all; every other name an A record 127.0.0.1 (and no AAAA), after --delay-ms.
Prints "READY" once listening."""
import argparse
import socket
import struct
import sys
import threading
import time


def qname(data, off):
    labels = []
    while data[off]:
        n = data[off]
        labels.append(data[off + 1: off + 1 + n].decode())
        off += 1 + n
    return ".".join(labels), off + 1


def answer(sock, data, addr, delay):
    name, end = qname(data, 12)
    qtype = struct.unpack("!H", data[end:end + 2])[0]
    question = data[12:end + 4]
    if name.startswith("drop"):
        return
    time.sleep(delay)
    tid = data[:2]
    if name.startswith("nx"):
        hdr = tid + struct.pack("!HHHHH", 0x8183, 1, 0, 0, 0)
        sock.sendto(hdr + question, addr)
        return
    if qtype == 1:
        rr = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + socket.inet_aton("127.0.0.1")
        hdr = tid + struct.pack("!HHHHH", 0x8180, 1, 1, 0, 0)
        sock.sendto(hdr + question + rr, addr)
    else:
        hdr = tid + struct.pack("!HHHHH", 0x8180, 1, 0, 0, 0)
        sock.sendto(hdr + question, addr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--delay-ms", type=float, default=0)
    a = ap.parse_args()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 53))
    print("READY", flush=True)
    while True:
        data, addr = s.recvfrom(512)
        threading.Thread(target=answer, args=(s, data, addr, a.delay_ms / 1000), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
