#!/usr/bin/env python3
"""An LLM API server of the tests' own that answers in each provider's
streaming shape, over HTTPS (--cert/--key) or plain HTTP, HTTP/1.1
keep-alive, with known delays. Standard library only.

POST, routed by the end of the request's path (any prefix before it, such as
a gateway's /gw/openai/v1/chat/completions, is accepted):
  .../chat/completions   OpenAI chat, also Azure's
                         /openai/deployments/{name}/chat/completions?api-version=..
                         "stream": true: server-sent events (`data:` lines,
                         then `data: [DONE]`); else one JSON answer
  .../responses          OpenAI Responses: "stream": true: typed events, an
                         `event: <type>` line before each `data:`; else one
                         JSON answer
  .../v1/messages        Anthropic Messages: "stream": true: typed events
                         (message_start .. message_stop, with a ping); else
                         one JSON answer
  .../api/chat, .../api/generate
                         Ollama: newline-delimited JSON
                         (application/x-ndjson); "stream": false: one JSON
  .../models/{model}:streamGenerateContent
                         Gemini: with ?alt=sse server-sent events, else one
                         JSON array streamed element by element ("[", then
                         the elements joined by ",\\r\\n", then "]")
  .../models/{model}:generateContent
                         Gemini, not streamed: one JSON answer
Any GET gets 200 "ok" after --first-ms; an unknown path a 404.

A streamed answer: --first-ms after the request was read, the head goes out
with the first event where the shape has one without content (OpenAI chat:
the role chunk; Responses: response.created, output_item.added,
content_part.added; Anthropic: message_start, content_block_start, ping);
Ollama and Gemini send the head alone. Then --chunks content events
("w0 ", "w1 ", ...), each after a sleep of --gap-ms, so the client's first
token comes about first-ms + gap-ms after its request; then the end events
with the usage, in one write. Streams use chunked transfer encoding; a
non-streamed answer has a Content-Length and leaves after --first-ms.

--style: how each JSON object is written: compact (no spaces), python
(json.dumps's default, `"a": 1, "b": 2`) or pretty (indent=2; in server-sent
events each line of it is a `data:` line of its own, one event; NDJSON
stays one line an object, in python spacing). --byte-at-a-time: every byte
of the answer after the head is a chunk (`1\\r\\nX\\r\\n`) of its own, sent
by its own write (TCP_NODELAY is on), so events split at every byte (a
non-streamed body: a write a byte, no chunk framing).

Numbers the tests compute: the model answered is the one asked for (the
body's "model", else the Azure deployment's or Gemini path's name) plus
"-served"; input tokens P = the request body's length in bytes modulo
1000, output tokens N = --chunks, cached input tokens 7, reasoning tokens 3
(where the shape has them). The OpenAI chat first event carries the
server's own wait from the request read to that send as
"system_fingerprint": "wait_ms=...".

Prints "PORT <n>" once listening on 127.0.0.1; serves until killed.
"""
import argparse
import json
import socket
import ssl
import sys
import threading
import time

CACHED = 7
REASONING = 3


class Out:
    """Writes one answer to the socket, in the chosen style."""

    def __init__(self, s, a):
        self.s, self.a = s, a

    def dumps(self, obj):
        if self.a.style == "compact":
            return json.dumps(obj, separators=(",", ":"))
        if self.a.style == "pretty":
            return json.dumps(obj, indent=2)
        return json.dumps(obj)

    def sse(self, obj, event=None):
        """One server-sent event; a multi-line (pretty) JSON as several data lines."""
        lines = "".join("data: %s\n" % line for line in self.dumps(obj).split("\n"))
        return (("event: %s\n" % event) if event else "").encode() + lines.encode() + b"\n"

    def ndjson(self, obj):
        """One NDJSON line: never multi-line, so pretty is written python-spaced."""
        if self.a.style == "compact":
            return (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        return (json.dumps(obj) + "\n").encode()

    def head(self, content_type, first=b""):
        """The streamed answer's head, and with it (one write) the first event."""
        head = (b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
                % content_type.encode())
        if self.a.byte_at_a_time or not first:
            self.s.sendall(head)
            self.send(first)
        else:
            self.s.sendall(head + b"%x\r\n%s\r\n" % (len(first), first))

    def send(self, data, last=False):
        """Body bytes as chunked encoding; last: with the terminating chunk."""
        end = b"0\r\n\r\n" if last else b""
        if self.a.byte_at_a_time and data:
            for i in range(len(data)):
                # The terminating chunk rides with the last byte, so a client
                # that stops at the last event has the whole answer read.
                self.s.sendall(b"1\r\n%s\r\n" % data[i:i + 1] + (end if i == len(data) - 1 else b""))
        elif data:
            self.s.sendall(b"%x\r\n%s\r\n" % (len(data), data) + end)
        elif end:
            self.s.sendall(end)

    def whole(self, content_type, obj):
        """A non-streamed answer: one JSON body with a Content-Length."""
        body = self.dumps(obj).encode()
        head = (b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n"
                % (content_type.encode(), len(body)))
        if self.a.byte_at_a_time:
            self.s.sendall(head)
            for i in range(len(body)):
                self.s.sendall(body[i:i + 1])
        else:
            self.s.sendall(head + body)


def gap(a):
    time.sleep(a.gap_ms / 1000.0)


def words(n):
    return "".join("w%d " % i for i in range(n))


def openai_chat(o, a, req, served, p, n, t_req):
    usage = {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n,
             "prompt_tokens_details": {"cached_tokens": CACHED},
             "completion_tokens_details": {"reasoning_tokens": REASONING}}
    if not req.get("stream"):
        o.whole("application/json", {
            "id": "c1", "object": "chat.completion", "created": 1, "model": served,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "w" * n},
                         "finish_reason": "stop"}],
            "usage": usage})
        return
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": served}
    first = dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                 system_fingerprint="wait_ms=%.3f" % ((time.monotonic() - t_req) * 1000))
    o.head("text/event-stream", o.sse(first))
    for i in range(n):
        gap(a)
        o.send(o.sse(dict(base, choices=[{"index": 0, "delta": {"content": "w%d " % i}}])))
    o.send(o.sse(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]))
           + o.sse(dict(base, choices=[], usage=usage)) + b"data: [DONE]\n\n", last=True)


def responses(o, a, req, served, p, n, _t):
    text = words(n)
    usage = {"input_tokens": p, "input_tokens_details": {"cached_tokens": CACHED, "cache_write_tokens": 0},
             "output_tokens": n, "output_tokens_details": {"reasoning_tokens": REASONING},
             "total_tokens": p + n}
    part = {"type": "output_text", "text": "", "annotations": []}
    item = {"id": "m1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    done_part = dict(part, text=text)
    done_item = dict(item, status="completed", content=[done_part])

    def response(status, output, with_usage=False):
        # The fields the SDK's Response model requires, and the usage.
        r = {"id": "r1", "object": "response", "created_at": 1, "model": served, "status": status,
             "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}
        if with_usage:
            r["usage"] = usage
        return r

    if not req.get("stream"):
        o.whole("application/json", response("completed", [done_item], True))
        return
    seq = [0]

    def ev(kind, **fields):
        obj = {"type": kind, "sequence_number": seq[0]}
        obj.update(fields)
        seq[0] += 1
        return o.sse(obj, event=kind)

    at = {"item_id": "m1", "output_index": 0, "content_index": 0}
    o.head("text/event-stream",
           ev("response.created", response=response("in_progress", []))
           + ev("response.output_item.added", output_index=0, item=item)
           + ev("response.content_part.added", part=part, **at))
    for i in range(n):
        gap(a)
        o.send(ev("response.output_text.delta", delta="w%d " % i, logprobs=[], **at))
    o.send(ev("response.output_text.done", text=text, logprobs=[], **at)
           + ev("response.content_part.done", part=done_part, **at)
           + ev("response.output_item.done", output_index=0, item=done_item)
           + ev("response.completed", response=response("completed", [done_item], True)), last=True)


def anthropic(o, a, req, served, p, n, _t):
    if not req.get("stream"):
        o.whole("application/json", {
            "id": "msg_1", "type": "message", "role": "assistant", "model": served,
            "content": [{"type": "text", "text": words(n)}],
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": p, "cache_read_input_tokens": CACHED,
                      "cache_creation_input_tokens": 0, "output_tokens": n}})
        return

    def ev(obj):
        return o.sse(obj, event=obj["type"])

    start = {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": served, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": p, "cache_read_input_tokens": CACHED, "cache_creation_input_tokens": 0,
                  "output_tokens": 1}}}
    o.head("text/event-stream",
           ev(start)
           + ev({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
           + ev({"type": "ping"}))
    for i in range(n):
        gap(a)
        o.send(ev({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": "w%d " % i}}))
    o.send(ev({"type": "content_block_stop", "index": 0})
           + ev({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                 "usage": {"output_tokens": n}})
           + ev({"type": "message_stop"}), last=True)


def ollama(o, a, req, served, p, n, chat):
    def obj(text, done):
        r = {"model": served, "created_at": "2024-01-01T00:00:00Z"}
        if chat:
            r["message"] = {"role": "assistant", "content": text}
        else:
            r["response"] = text
        r["done"] = done
        if done:
            r.update(done_reason="stop", total_duration=1, prompt_eval_count=p, eval_count=n)
        return r

    if req.get("stream") is False:
        o.whole("application/json", obj(words(n), True))
        return
    o.head("application/x-ndjson")
    for i in range(n):
        gap(a)
        o.send(o.ndjson(obj("w%d " % i, False)))
    o.send(o.ndjson(obj("", True)), last=True)


def gemini_chunk(served, p, n, i, text):
    cand = {"content": {"parts": [{"text": text}], "role": "model"}, "index": 0}
    usage = {"promptTokenCount": p, "candidatesTokenCount": i + 1, "totalTokenCount": p + i + 1}
    if i == n - 1:
        cand["finishReason"] = "STOP"
        usage = {"promptTokenCount": p, "candidatesTokenCount": n, "cachedContentTokenCount": CACHED,
                 "thoughtsTokenCount": REASONING, "totalTokenCount": p + n}
    return {"candidates": [cand], "usageMetadata": usage, "modelVersion": served}


def gemini(o, a, req, served, p, n, mode):
    if mode == "whole":
        o.whole("application/json", gemini_chunk(served, p, n, n - 1, words(n)))
        return
    sse = mode == "sse"
    o.head("text/event-stream" if sse else "application/json", b"" if sse else b"[")
    for i in range(n):
        gap(a)
        chunk = gemini_chunk(served, p, n, i, "w%d " % i)
        if sse:
            o.send(o.sse(chunk))
        else:
            o.send((b"" if i == 0 else b",\r\n") + o.dumps(chunk).encode())
    o.send(b"" if sse else b"]", last=True)


def route(target):
    """(answer(o, a, req, served, p, n, t_req), the model the path names) for a request target."""
    path, _, query = target.partition("?")
    if "/models/" in path and ":" in path.rsplit("/models/", 1)[1]:
        model, _, verb = path.rsplit("/models/", 1)[1].partition(":")
        if verb == "streamGenerateContent":
            mode = "sse" if "alt=sse" in query.split("&") else "array"
        elif verb == "generateContent":
            mode = "whole"
        else:
            return None, None
        return (lambda o, a, r, s, p, n, t: gemini(o, a, r, s, p, n, mode)), model
    deployment = None
    if "/openai/deployments/" in path:
        deployment = path.split("/openai/deployments/", 1)[1].split("/", 1)[0]
    if path.endswith("/chat/completions"):
        return openai_chat, deployment
    if path.endswith("/responses"):
        return responses, deployment
    if path.endswith("/v1/messages"):
        return anthropic, None
    if path.endswith("/api/chat"):
        return (lambda o, a, r, s, p, n, t: ollama(o, a, r, s, p, n, True)), None
    if path.endswith("/api/generate"):
        return (lambda o, a, r, s, p, n, t: ollama(o, a, r, s, p, n, False)), None
    return None, None


def read_request(f):
    """(method, target, body) of the next request, or None at the end."""
    line = f.readline()
    if not line:
        return None
    parts = line.split(b" ")
    length = 0
    while True:
        h = f.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    target = parts[1].decode("latin-1") if len(parts) > 1 else "/"
    return parts[0], target, f.read(length)


def answer(s, target, body, a):
    t_req = time.monotonic()
    handler, path_model = route(target)
    if handler is None:
        s.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        return
    req = json.loads(body) if body.strip() else {}
    model = (req.get("model") if isinstance(req, dict) else None) or path_model or ""
    time.sleep(a.first_ms / 1000.0)
    handler(Out(s, a), a, req if isinstance(req, dict) else {}, model + "-served", len(body) % 1000,
            a.chunks, t_req)


def serve(conn, ctx, a):
    try:
        s = ctx.wrap_socket(conn, server_side=True) if ctx else conn
        f = s.makefile("rb")
        while True:
            req = read_request(f)
            if req is None:
                return
            method, target, body = req
            if method == b"GET":
                time.sleep(a.first_ms / 1000.0)
                s.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
                continue
            answer(s, target, body, a)
    except (OSError, ssl.SSLError, ValueError):
        pass
    finally:
        try:
            conn.close()
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cert", help="certificate (PEM): serve TLS")
    ap.add_argument("--key", help="its private key (PEM)")
    ap.add_argument("--port", type=int, default=0, help="0: any free port")
    ap.add_argument("--first-ms", type=float, default=150, help="wait before the answer's head")
    ap.add_argument("--gap-ms", type=float, default=30, help="wait before each content event")
    ap.add_argument("--chunks", type=int, default=5, help="content events (= output tokens)")
    ap.add_argument("--style", choices=["compact", "python", "pretty"], default="compact",
                    help="how JSON is written")
    ap.add_argument("--byte-at-a-time", action="store_true",
                    help="every body byte a chunk and a write of its own")
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
