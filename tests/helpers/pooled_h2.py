"""HTTP/2 connections that begin before the observer does (httpx).

  pooled_h2.py TLS_BASE PLAIN_BASE
      Two clients: h2 over TLS to TLS_BASE, cleartext h2 with prior knowledge
      to PLAIN_BASE. Each makes one request ("/before"), then this prints
      "READY" and waits for a line on stdin; then each makes four more on the
      same connection ("/after/0" ... "/after/3"), one JSON line per request:
      which client, local_port, stream_id, path, status, ttfb_ms (its own
      clock).
"""

import json
import sys
import time

import httpx

tls_base, plain_base = sys.argv[1], sys.argv[2]
clients = {
    "tls": (httpx.Client(http2=True, verify=False, timeout=10), tls_base),
    "plain": (httpx.Client(http1=False, http2=True, timeout=10), plain_base),
}


def get(name, path):
    client, base = clients[name]
    t0 = time.perf_counter_ns()
    with client.stream("GET", base + path) as r:
        ttfb = time.perf_counter_ns() - t0
        r.read()
    stream = r.extensions.get("network_stream")
    addr = stream.get_extra_info("client_addr") if stream else None
    return {
        "client": name,
        "local_port": addr[1] if addr else None,
        "http_version": r.http_version,
        "stream_id": r.extensions.get("stream_id"),
        "path": path,
        "status": r.status_code,
        "ttfb_ms": ttfb / 1e6,
    }


for name in clients:
    get(name, "/before")
print("READY", flush=True)
sys.stdin.readline()
for name in clients:
    for i in range(4):
        print(json.dumps(get(name, f"/after/{i}")), flush=True)
for client, _ in clients.values():
    client.close()
