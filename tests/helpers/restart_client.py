"""Connections that outlive an observer, and load while it dies.

  restart_client.py TLS_BASE PLAIN_BASE H1_BASE
      Three clients, each on one connection for its whole life: h2 over TLS
      to TLS_BASE, cleartext h2 with prior knowledge to PLAIN_BASE, HTTP/1.1
      keep-alive to H1_BASE. Each makes one request ("/before"), then this
      prints "READY". Each stdin line "TAG N": each client makes N requests
      on its connection ("/TAG/0" ...), one JSON line per request (which
      client, local_port, stream_id, path, status, ttfb_ms: its own clock),
      then "DONE TAG". "load": a thread starts GETs on connections of its
      own to H1_BASE, one after another, until stdin ends; then it prints
      "LOAD n" (how many it made).
"""

import json
import sys
import threading

import httpx

from httpx_h2 import timed_get

tls_base, plain_base, h1_base = sys.argv[1], sys.argv[2], sys.argv[3]
# httpx closes a connection idle for 5 s by default: the restart takes longer.
kept = httpx.Limits(keepalive_expiry=120)
clients = {
    "tls": (httpx.Client(http2=True, verify=False, timeout=10, limits=kept), tls_base),
    "plain": (httpx.Client(http1=False, http2=True, timeout=10, limits=kept), plain_base),
    "h1": (httpx.Client(timeout=10, limits=kept), h1_base),
}
stop = threading.Event()
made = [0]


def get(name, path):
    client, base = clients[name]
    return dict(timed_get(client, base + path), client=name, path=path)


def load():
    # A new connection now and then too (every 20th), as busy clients do.
    while not stop.is_set():
        with httpx.Client(timeout=10) as c:
            for _ in range(20):
                if stop.is_set():
                    break
                c.get(h1_base + "/load").read()
                made[0] += 1


for name in clients:
    get(name, "/before")
print("READY", flush=True)
loader = None
for line in sys.stdin:
    words = line.split()
    if words == ["load"]:
        loader = threading.Thread(target=load)
        loader.start()
        continue
    tag, n = words[0], int(words[1])
    for name in clients:
        for i in range(n):
            print(json.dumps(get(name, f"/{tag}/{i}")), flush=True)
    print(f"DONE {tag}", flush=True)
stop.set()
if loader:
    loader.join()
    print(f"LOAD {made[0]}", flush=True)
for client, _ in clients.values():
    client.close()
