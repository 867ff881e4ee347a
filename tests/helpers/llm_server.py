#!/usr/bin/env python3
"""An OpenAI-compatible chat completions server of the tests' own, over
HTTPS (--cert/--key) or plain HTTP, with known delays.

POST /v1/chat/completions, keep-alive; any GET gets "ok" after --first-ms. With "stream": true it waits
--first-ms, sends the head and a role chunk, then --chunks content chunks
--gap-ms apart, then a finish chunk, a usage chunk and [DONE] in one write
(chunked server-sent events). Without it: one JSON answer with usage after
--first-ms. A request whose model is "fail" gets a 500; "reset" gets a reset
after two content chunks. Usage: prompt_tokens is the request body's length
in bytes modulo 1000, completion_tokens the chunk count (the tests compute
both). Prints "PORT <n>" once listening; serves until killed.
"""
import argparse
import json
import socket
import ssl
import struct
import sys
import threading
import time


def chunk(data):
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(obj):
    return chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def read_request(f):
    """(method, body) of the next request, or None at the end."""
    line = f.readline()
    if not line:
        return None
    method = line.split(b" ", 1)[0]
    length = 0
    while True:
        h = f.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    return method, f.read(length)


def answer(s, body, a):
    # The server's own clock from the request read to its answer's first
    # send: the wait the tests injected plus what this process took beyond
    # it (a late wake-up from the sleep, building the answer). It goes out in
    # the first event as `system_fingerprint` ("wait_ms=..."), a field the
    # OpenAI chunk carries, so clients can report it.
    t_req = time.monotonic()
    req = json.loads(body)
    model = req.get("model", "")
    answer_model = model + "-served"
    prompt_tokens = len(body) % 1000
    time.sleep(a.first_ms / 1000.0)
    if model == "fail":
        err = b'{"error":{"message":"boom"}}'
        s.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(err), err))
        return True
    base = {"id": "c1", "object": "chat.completion.chunk", "model": answer_model}
    if not req.get("stream"):
        out = json.dumps({
            "id": "c1", "object": "chat.completion", "model": answer_model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "w" * a.chunks}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": a.chunks, "total_tokens": prompt_tokens + a.chunks},
        }).encode()
        s.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(out), out))
        return True
    first = dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}])
    first["system_fingerprint"] = "wait_ms=%.3f" % ((time.monotonic() - t_req) * 1000)
    s.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
              + event(first))
    for i in range(a.chunks):
        time.sleep(a.gap_ms / 1000.0)
        s.sendall(event(dict(base, choices=[{"index": 0, "delta": {"content": "w%d " % i}}])))
        if model == "reset" and i == 1:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
    s.sendall(event(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]))
              + event(dict(base, choices=[], usage={"prompt_tokens": prompt_tokens, "completion_tokens": a.chunks,
                                                    "total_tokens": prompt_tokens + a.chunks}))
              + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    return True


def serve(conn, ctx, a):
    try:
        s = ctx.wrap_socket(conn, server_side=True) if ctx else conn
        f = s.makefile("rb")
        while True:
            req = read_request(f)
            if req is not None and req[0] == b"GET":
                time.sleep(a.first_ms / 1000.0)
                s.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
                continue
            if req is None or not answer(s, req[1], a):
                # A reset: no TLS close_notify, SO_LINGER 0.
                f.close()
                s.close()
                return
    except (OSError, ssl.SSLError, ValueError):
        pass
    finally:
        try:
            conn.close()
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--first-ms", type=float, default=300)
    ap.add_argument("--gap-ms", type=float, default=40)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    ctx = None
    if a.cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(a.cert, a.key)
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", a.port))
    ls.listen(64)
    print("PORT %d" % ls.getsockname()[1], flush=True)
    while True:
        conn, _ = ls.accept()
        # As streaming servers do: each event leaves at once, not held back
        # (Nagle) until the client's delayed ACK of the previous one.
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve, args=(conn, ctx, a), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
