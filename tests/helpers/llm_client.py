#!/usr/bin/env python3
"""A chat completions client over one kept-alive connection (Python's ssl
over a raw socket, so that every time is this process's own clock at the
call that moved the bytes).

Connects (TLS unless --plain), waits --settle-ms, then sends one request per
--model given, in order, each streamed unless --no-stream. Prints one JSON
line per request: local_port, the request body's length, time from sending
the request to the first byte of the answer (ttfb_ms), to the first event
carrying content (ttft_ms), the events it counted, the status and bytes
each way.
"""
import argparse
import json
import socket
import ssl
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--settle-ms", type=float, default=0)
    ap.add_argument("--no-stream", action="store_true")
    ap.add_argument("--model", action="append", required=True)
    a = ap.parse_args()
    if not a.plain:
        # As HTTP clients do (httpx, requests, urllib): the context, with the
        # system's CA certificates loaded, before the first connection.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    raw = socket.create_connection(("127.0.0.1", a.port))
    port = raw.getsockname()[1]
    if a.plain:
        s = raw
    else:
        s = ctx.wrap_socket(raw, server_hostname="llm.test")
    time.sleep(a.settle_ms / 1000.0)
    for model in a.model:
        body = json.dumps({
            "messages": [{"role": "user", "content": "Say twenty words."}],
            "model": model,
            "stream": not a.no_stream,
        }).encode()
        req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: llm.test\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        t0 = time.perf_counter()
        s.sendall(req)
        buf, ttfb, ttft, events, status, done = b"", None, None, 0, None, False
        while not done:
            try:
                d = s.recv(65536)
            except (ConnectionResetError, ssl.SSLError):
                d = b""
            t = (time.perf_counter() - t0) * 1000
            if not d:
                break
            if ttfb is None:
                ttfb = t
            buf += d
            if status is None and b"\r\n\r\n" in buf:
                status = int(buf.split(b" ", 2)[1])
            # Count events in what this read brought.
            for line in d.split(b"\n"):
                if line.startswith(b"data:"):
                    events += 1
                    if ttft is None and b'"content":"' in line and b'"content":""' not in line:
                        ttft = t
            head, _, rest = buf.partition(b"\r\n\r\n")
            if b"chunked" in head.lower():
                done = buf.endswith(b"0\r\n\r\n")
            elif b"content-length" in head.lower() and b"\r\n\r\n" in buf:
                n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                done = len(rest) >= n
                if done and ttft is None and b'"content":"w' in rest:
                    ttft = t
        print(json.dumps({"local_port": port, "body_len": len(body), "ttfb_ms": ttfb, "ttft_ms": ttft,
                          "events": events, "status": status, "sent": len(req), "received": len(buf)}), flush=True)
        if not done:
            break
    s.close()


if __name__ == "__main__":
    sys.exit(main())
