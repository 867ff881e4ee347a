#!/usr/bin/env python3
"""A DNS server for the tests, on 127.0.0.1:53 over UDP and TCP and on
[::1]:53 over UDP (one question per query).

Every name gets an A record 127.0.0.1 (and no AAAA) after --delay-ms, except:
names starting with "nx" get NXDOMAIN, "drop" no answer at all, "once" no
answer to the first query for the name (answers to the ones after), "tc" a
truncated empty answer over UDP (the full one over TCP), and "tcl" the same with
the A answer over UDP 20 ms after the others (a client's AAAA answer first).
With --log FILE, each query received is a line there, written before its answer
is sent: "NAME QTYPE udp|tcp RECEIVED SENT", CLOCK_MONOTONIC ns (the clock of the
observer's eBPF timestamps) just after the query was read and just before the
answer was sent ("-": not answered). The tests count retries and time lookups
against it.
Prints "READY" once listening."""
import argparse
import socket
import struct
import sys
import threading
import time

seen = set()
seen_lock = threading.Lock()
log = None
log_lock = threading.Lock()


def log_query(data, tcp, received, answered):
    """Logs the query `data`, read at `received`; `answered`: its answer is
    sent right after this returns."""
    if log is None:
        return
    name, end = qname(data, 12)
    qtype = struct.unpack("!H", data[end:end + 2])[0]
    sent = time.monotonic_ns() if answered else "-"
    with log_lock:
        log.write(f"{name} {qtype} {'tcp' if tcp else 'udp'} {received} {sent}\n")
        log.flush()


def qname(data, off):
    labels = []
    while data[off]:
        n = data[off]
        labels.append(data[off + 1: off + 1 + n].decode())
        off += 1 + n
    return ".".join(labels), off + 1


def reply(data, delay, tcp):
    """The response to the query `data`, or None for no answer."""
    name, end = qname(data, 12)
    qtype = struct.unpack("!H", data[end:end + 2])[0]
    question = data[12:end + 4]
    if name.startswith("drop"):
        return None
    if name.startswith("once"):
        with seen_lock:
            first = (name, qtype) not in seen
            seen.add((name, qtype))
        if first:
            return None
    if name.startswith("tcl") and qtype == 1 and not tcp:
        delay += 0.02
    time.sleep(delay)
    tid = data[:2]
    if name.startswith("nx"):
        return tid + struct.pack("!HHHHH", 0x8183, 1, 0, 0, 0) + question
    if name.startswith("tc") and not tcp:
        return tid + struct.pack("!HHHHH", 0x8380, 1, 0, 0, 0) + question
    if qtype == 1:
        rr = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + socket.inet_aton("127.0.0.1")
        return tid + struct.pack("!HHHHH", 0x8180, 1, 1, 0, 0) + question + rr
    return tid + struct.pack("!HHHHH", 0x8180, 1, 0, 0, 0) + question


def udp_answer(sock, data, addr, delay, received):
    r = reply(data, delay, False)
    log_query(data, False, received, r is not None)
    if r is not None:
        sock.sendto(r, addr)


def recv_exact(conn, n):
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def tcp_client(conn, delay):
    with conn:
        while True:
            head = recv_exact(conn, 2)
            if head is None:
                return
            data = recv_exact(conn, struct.unpack("!H", head)[0])
            received = time.monotonic_ns()
            if data is None:
                return
            r = reply(data, delay, True)
            log_query(data, True, received, r is not None)
            if r is not None:
                conn.sendall(struct.pack("!H", len(r)) + r)


def tcp_server(delay):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 53))
    ls.listen(64)
    while True:
        conn, _ = ls.accept()
        threading.Thread(target=tcp_client, args=(conn, delay), daemon=True).start()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--delay-ms", type=float, default=0)
    ap.add_argument("--log")
    a = ap.parse_args()
    global log
    if a.log:
        log = open(a.log, "w")
    delay = a.delay_ms / 1000
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 53))
    s6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s6.bind(("::1", 53))
    threading.Thread(target=tcp_server, args=(delay,), daemon=True).start()
    threading.Thread(target=udp_server, args=(s6, delay), daemon=True).start()
    print("READY", flush=True)
    udp_server(s, delay)


def udp_server(s, delay):
    while True:
        data, addr = s.recvfrom(512)
        received = time.monotonic_ns()
        threading.Thread(target=udp_answer, args=(s, data, addr, delay, received), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
