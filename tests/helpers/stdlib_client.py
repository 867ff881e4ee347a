#!/usr/bin/env python3
"""Streamed chat completions through Python's http.client over HTTPS, one
kept-alive connection, timing itself.

Connects first (so each request's clock starts at its own write), then per
--model: request(), getresponse() (ttfb_ms: the answer's head parsed), the
body read as it comes (ttft_ms: the first read carrying content). Prints
one JSON line per request: local port, times, events, status, usage.
"""
import argparse
import http.client
import json
import ssl
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", action="append", required=True)
    a = ap.parse_args()
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    conn = http.client.HTTPSConnection("127.0.0.1", a.port, context=ctx)
    conn.connect()
    port = conn.sock.getsockname()[1]
    for model in a.model:
        body = json.dumps({"model": model, "stream": True,
                           "messages": [{"role": "user", "content": "Say twenty words."}]})
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        ttfb = (time.perf_counter() - t0) * 1000
        ttft, events, usage, text, server_wait = None, 0, None, b"", None
        while True:
            part = resp.read1(65536)
            if not part:
                break
            t = (time.perf_counter() - t0) * 1000
            if ttft is None and b'"content":"w' in part:
                ttft = t
            text += part
        for line in text.split(b"\n"):
            if line.startswith(b"data:"):
                events += 1
                data = line[5:].strip()
                if data != b"[DONE]":
                    obj = json.loads(data)
                    fp = obj.get("system_fingerprint") or ""
                    if server_wait is None and fp.startswith("wait_ms="):
                        server_wait = float(fp[len("wait_ms="):])
                    u = obj.get("usage")
                    if u:
                        usage = {"input": u["prompt_tokens"], "output": u["completion_tokens"]}
        print(json.dumps({"local_port": port, "model": model, "status": resp.status, "ttfb_ms": ttfb,
                          "ttft_ms": ttft, "events": events, "usage": usage,
                          "server_wait_ms": server_wait}), flush=True)


if __name__ == "__main__":
    main()
