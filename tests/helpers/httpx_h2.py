"""httpx with HTTP/2 (the h2 package over Python's ssl, i.e. OpenSSL).

  httpx_h2.py WARM_URL BASE PATH...
      One client: WARM_URL first (another host name, so its own connection:
      it gives a fresh process's probes time to come), then BASE+PATH for
      each PATH on one h2 connection. Per PATH one JSON line: local_port,
      http_version, stream_id, status, and ttfb_ms (its own clock: from just
      before the request is sent to its answer's headers).
"""

import json
import sys
import time

import httpx

warm, base, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
with httpx.Client(http2=True, verify=False, timeout=10) as client:
    client.get(warm).read()
    for path in paths:
        t0 = time.perf_counter_ns()
        with client.stream("GET", base + path) as r:
            ttfb = time.perf_counter_ns() - t0
            r.read()
        stream = r.extensions.get("network_stream")
        addr = stream.get_extra_info("client_addr") if stream else None
        print(
            json.dumps(
                {
                    "local_port": addr[1] if addr else None,
                    "http_version": r.http_version,
                    "stream_id": r.extensions.get("stream_id"),
                    "status": r.status_code,
                    "ttfb_ms": ttfb / 1e6,
                }
            ),
            flush=True,
        )
