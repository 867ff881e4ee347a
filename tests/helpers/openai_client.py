#!/usr/bin/env python3
"""Streamed chat completions through the official `openai` SDK (run by the
virtual environment's python, see tests/src/lib.rs), one pooled connection,
timing itself.

For each --model, in order: `chat.completions.create(stream=True)` with
usage included; prints one JSON line: the connection's local port (read off
the SDK's pool), the time from the call to the first chunk (ttfb_ms) and to
the first chunk carrying content (ttft_ms), the chunks, the usage and the
model the server named, the finish reason.

A chunk's time is that of the socket read that brought its last bytes (the
reads are patched to note when each returned), as curl's -w and Go's
httptrace time the wire: the SDK's parsing after it (pure-Python h2, SSE,
pydantic), or the scheduler running something else first, is not the
server's.
"""
import argparse
import json
import os
import socket
import ssl
import time

# The SDK builds each pydantic model on its first use, by default: build
# them as it is imported, before any timing.
os.environ.setdefault("DEFER_PYDANTIC_BUILD", "false")

import openai  # noqa: E402

from wire_clock import LAST_READ, patch_reads  # noqa: E402


def wait_of(fingerprint):
    """The test server's own wait before its answer ("wait_ms=..."), or None."""
    if fingerprint and fingerprint.startswith("wait_ms="):
        return float(fingerprint[len("wait_ms="):])
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--http2", action="store_true", help="HTTP/2 (ALPN h2; needs the h2 package)")
    ap.add_argument("--model", action="append", required=True)
    a = ap.parse_args()
    ports = []
    real_connect = socket.socket.connect

    def connect(self, addr):
        real_connect(self, addr)
        ports.append(self.getsockname()[1])

    # The SDK's transport connects deep inside; note each socket's port.
    socket.socket.connect = connect
    # And when each read returns.
    patch_reads(socket, ssl)
    scheme = "http" if a.plain else "https"
    client = openai.OpenAI(
        base_url="%s://127.0.0.1:%d/v1" % (scheme, a.port),
        api_key="test-key",
        max_retries=0,
        http_client=openai.DefaultHttpx2Client(verify=False, http2=a.http2),
    )
    for model in a.model:
        LAST_READ[0] = None
        t0 = time.perf_counter()
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Say twenty words."}],
            stream=True,
            stream_options={"include_usage": True},
        )
        ttfb = ttft = usage = finish = served = server_wait = None
        chunks = 0
        for ch in stream:
            t = ((LAST_READ[0] or time.perf_counter()) - t0) * 1000
            chunks += 1
            if ttfb is None:
                ttfb = t
                server_wait = wait_of(ch.system_fingerprint)
            served = ch.model
            if ch.choices:
                c = ch.choices[0]
                if ttft is None and c.delta.content:
                    ttft = t
                if c.finish_reason:
                    finish = c.finish_reason
            if ch.usage:
                usage = {"input": ch.usage.prompt_tokens, "output": ch.usage.completion_tokens}
        print(json.dumps({"local_port": ports[-1] if ports else None, "connections": len(ports),
                          "ttfb_ms": ttfb, "ttft_ms": ttft, "chunks": chunks, "usage": usage,
                          "response_model": served, "finish_reason": finish,
                          "server_wait_ms": server_wait}), flush=True)


if __name__ == "__main__":
    main()
