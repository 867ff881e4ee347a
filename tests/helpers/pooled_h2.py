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

import httpx

from httpx_h2 import timed_get

tls_base, plain_base = sys.argv[1], sys.argv[2]
clients = {
    "tls": (httpx.Client(http2=True, verify=False, timeout=10), tls_base),
    "plain": (httpx.Client(http1=False, http2=True, timeout=10), plain_base),
}


def get(name, path):
    client, base = clients[name]
    return dict(timed_get(client, base + path), client=name, path=path)


for name in clients:
    get(name, "/before")
print("READY", flush=True)
sys.stdin.readline()
for name in clients:
    for i in range(4):
        print(json.dumps(get(name, f"/after/{i}")), flush=True)
for client, _ in clients.values():
    client.close()
