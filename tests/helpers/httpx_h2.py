"""httpx with HTTP/2 (the h2 package, over Python's ssl: OpenSSL).

  httpx_h2.py WARM_URL BASE PATH...
      One client: WARM_URL first (another host name, so its own connection:
      it gives a fresh process's probes time to come), then BASE+PATH for
      each PATH on one h2 connection. Per PATH one JSON line (see
      timed_get).
"""

import json
import sys
import time

import httpx


def timed_get(client, url):
    """GET url; what the answer was, and ttfb_ms by its own clock: from just
    before the request is sent to its answer's headers."""
    t0 = time.perf_counter_ns()
    with client.stream("GET", url) as r:
        ttfb = time.perf_counter_ns() - t0
        r.read()
    stream = r.extensions.get("network_stream")
    addr = stream.get_extra_info("client_addr") if stream else None
    return {
        "local_port": addr[1] if addr else None,
        "http_version": r.http_version,
        "stream_id": r.extensions.get("stream_id"),
        "status": r.status_code,
        "ttfb_ms": ttfb / 1e6,
    }


def main():
    warm, base, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
    with httpx.Client(http2=True, verify=False, timeout=10) as client:
        client.get(warm).read()
        for path in paths:
            print(json.dumps(timed_get(client, base + path)), flush=True)


if __name__ == "__main__":
    main()
