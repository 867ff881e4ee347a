#!/usr/bin/env python3
"""An HTTP/1.1 client with a connection pool of one of three habits, for the
pool tests:

  pool_client.py MODE PORT COUNT INTERVAL_MS

  reuse: one keep-alive connection for every request, left open after;
  new:   a new connection per request, closed by the client after the answer;
  leak:  a new connection per request, never closed (held until the end).

Sends COUNT GETs, one every INTERVAL_MS, each answer read whole. Then
prints one JSON line with its own counts (requests, connections opened and
closed, and the local ports of those still open) and holds its connections
until stdin closes, then exits (closing whatever is left).
"""
import http.client
import json
import sys
import time


def main():
    mode, port, count, interval_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    held = []
    opened = closed = requests = 0
    reused = None
    for i in range(count):
        started = time.monotonic()
        if mode == "reuse" and reused is not None:
            conn = reused
        else:
            conn = http.client.HTTPConnection("127.0.0.1", port)
            conn.connect()
            opened += 1
        conn.request("GET", f"/{mode}/{i}")
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200, resp.status
        requests += 1
        if mode == "reuse":
            reused = conn
        elif mode == "new":
            conn.close()
            closed += 1
        elif mode == "leak":
            held.append(conn)
        else:
            raise SystemExit(f"unknown mode {mode}")
        left = interval_ms / 1000 - (time.monotonic() - started)
        if left > 0:
            time.sleep(left)
    still = held + ([reused] if reused is not None else [])
    ports = [c.sock.getsockname()[1] for c in still]
    print(json.dumps({
        "mode": mode,
        "requests": requests,
        "opened": opened,
        "closed": closed,
        "open_ports": ports,
    }), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
