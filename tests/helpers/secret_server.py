#!/usr/bin/env python3
"""A server for tests/tests/secrets.rs whose every answer carries known
secrets: HTTP/1.1 with keep-alive, over TLS (--cert/--key) or plain.

Every answer has `Set-Cookie: sid=<--set-cookie>`. Its body carries
<--reply> where an API puts its text:
  POST .../chat/completions  an OpenAI chat completion: one JSON answer, or
                             with "stream": true server-sent events, each
                             content delta the reply
  POST .../messages          an Anthropic message
  POST ...:generateContent   a Gemini answer
  anything else              text/plain, the reply
Request bodies (Content-Length or chunked) are read and dropped. Prints
"PORT <n>" once listening; serves until killed.
"""
import argparse
import json
import socket
import ssl
import threading


def read_request(f):
    """(method, target, body) of the next request, or None at the end."""
    line = f.readline()
    if not line:
        return None
    method, target = line.split(b" ")[:2]
    length, chunked = 0, False
    while True:
        h = f.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        name, _, value = h.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value.strip())
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        body = b""
        while True:
            size = int(f.readline().split(b";")[0].strip(), 16)
            body += f.read(size)
            f.readline()
            if size == 0:
                break
    else:
        body = f.read(length)
    return method, target.decode(), body


def chunk(data):
    return b"%x\r\n%s\r\n" % (len(data), data)


def answer(s, target, body, a):
    path = target.split("?", 1)[0]
    try:
        req = json.loads(body) if body else {}
    except ValueError:
        req = {}
    if not isinstance(req, dict):
        req = {}
    model = req.get("model", "secret-model")
    head = "HTTP/1.1 200 OK\r\nSet-Cookie: sid=%s; HttpOnly\r\n" % a.set_cookie
    usage = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    if path.endswith("/chat/completions") and req.get("stream"):
        s.sendall((head + "Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n").encode())
        for i in range(3):
            ev = {"id": "c1", "object": "chat.completion.chunk", "model": model + "-served",
                  "choices": [{"index": 0, "delta": {"content": "%s %d " % (a.reply, i)},
                               "finish_reason": None}]}
            s.sendall(chunk(b"data: " + json.dumps(ev).encode() + b"\n\n"))
        done = {"id": "c1", "object": "chat.completion.chunk", "model": model + "-served",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage}
        s.sendall(chunk(b"data: " + json.dumps(done).encode() + b"\n\n")
                  + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        return
    if path.endswith("/chat/completions"):
        out = {"id": "c1", "object": "chat.completion", "created": 1700000000,
               "model": model + "-served",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": a.reply},
                            "finish_reason": "stop"}], "usage": usage}
    elif path.endswith("/messages"):
        out = {"id": "msg_1", "type": "message", "role": "assistant", "model": model + "-served",
               "content": [{"type": "text", "text": a.reply}], "stop_reason": "end_turn",
               "stop_sequence": None, "usage": {"input_tokens": 11, "output_tokens": 3}}
    elif path.endswith(":generateContent"):
        out = {"candidates": [{"content": {"role": "model", "parts": [{"text": a.reply}]},
                               "finishReason": "STOP", "index": 0}],
               "usageMetadata": {"promptTokenCount": 11, "candidatesTokenCount": 3,
                                 "totalTokenCount": 14},
               "modelVersion": "gemini-secret-served"}
    else:
        data = (a.reply + "\n").encode()
        s.sendall((head + "Content-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(data)).encode() + data)
        return
    data = json.dumps(out).encode()
    s.sendall((head + "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(data)).encode() + data)


def serve(conn, ctx, a):
    try:
        s = ctx.wrap_socket(conn, server_side=True) if ctx else conn
        f = s.makefile("rb")
        while True:
            r = read_request(f)
            if r is None:
                break
            _method, target, body = r
            answer(s, target, body, a)
    except (OSError, ssl.SSLError, ValueError):
        pass
    finally:
        conn.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--reply", required=True)
    ap.add_argument("--set-cookie", required=True)
    a = ap.parse_args()
    ctx = None
    if a.cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(a.cert, a.key)
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    print("PORT %d" % ls.getsockname()[1], flush=True)
    while True:
        conn, _ = ls.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve, args=(conn, ctx, a), daemon=True).start()


if __name__ == "__main__":
    main()
