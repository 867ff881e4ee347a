#!/usr/bin/env python3
"""LLM API calls through the official SDKs (`openai`, `anthropic`; run by the
virtual environment's python that has them) or, for the APIs without one
here (Ollama, Gemini), through their HTTP client (httpx2, or httpx where
that is what is installed), timing themselves. The other end is
tests/helpers/llm_shapes.py.

--api: chat (OpenAI chat completions), responses (OpenAI Responses), azure
(AzureOpenAI chat completions, the deployment named by the model), anthropic
(Messages, raw events), ollama-chat (/api/chat), ollama-generate
(/api/generate), gemini (:streamGenerateContent, a streamed JSON array,
parsed incrementally), gemini-sse (the same with ?alt=sse). --prefix: a base
path before the API's own (a gateway's, e.g. /gw/openai). --no-stream: the
non-streamed call (gemini: :generateContent).

For each --model, in order, one call, all on one client and so one pooled
connection (azure: a client a deployment, sharing one HTTP client); prints
one JSON line:
  api, model              what was asked
  local_port              the local port of the connection last made
  connections             connections made so far (socket.connect is
                          patched to count them)
  ttfb_ms                 from just before the call to the first event the
                          SDK yields (raw HTTP: the response head; not
                          streamed: the call's return)
  ttft_ms                 to the first event carrying generated text
  content_times_ms        the time of each event carrying generated text
  events                  the events (chunks, lines, array elements) seen
  input_tokens, output_tokens, cached_tokens, reasoning_tokens
                          the usage as parsed (null where the shape has none)
  response_model          the model the answer named
  finish_reason           chat: finish_reason; responses: the response's
                          status; anthropic: stop_reason; ollama:
                          done_reason; gemini: finishReason
  server_wait_ms          chat / azure streamed: the test server's own wait
                          from its first event's system_fingerprint, else null
  request_sent_ms         when the request's first write left (after any
                          connect and TLS handshake)
Times are time.perf_counter() milliseconds from just before the call. An
event's time is that of the socket read that brought its last bytes (the
reads are patched to note when each returned), as curl's -w and Go's
httptrace time the wire: what the SDK does after (parsing, validating, the
scheduler running something else first) is not the server's. The SDKs'
lazy work (pydantic models built on first use, resources imported on first
touch) is done before the first call too.
"""
import argparse
import codecs
import json
import os
import socket
import ssl
import time

# The SDKs build each pydantic model on its first use, by default: the first
# call's first events would wait on that (up to ~150 ms for the Responses
# events), so build them as the SDK is imported, before any timing.
os.environ.setdefault("DEFER_PYDANTIC_BUILD", "false")

try:
    import httpx2 as httpx
except ImportError:  # SDK versions built on the original httpx
    import httpx

from wire_clock import LAST_READ, SENT, noting_writes, patch_reads  # noqa: E402

PROMPT = "Say five words."


class Call:
    """One call's observations."""

    def __init__(self, api, model):
        SENT.clear()
        LAST_READ[0] = None
        self.t0 = time.perf_counter()
        self.r = {"api": api, "model": model, "local_port": None, "connections": 0,
                  "ttfb_ms": None, "ttft_ms": None, "content_times_ms": [], "events": 0,
                  "input_tokens": None, "output_tokens": None, "cached_tokens": None,
                  "reasoning_tokens": None, "response_model": None, "finish_reason": None,
                  "server_wait_ms": None}

    def now(self):
        """When the bytes of what the client just handed over arrived: the
        last read's time (the time now before any read)."""
        t = LAST_READ[0] if LAST_READ[0] is not None and LAST_READ[0] >= self.t0 else time.perf_counter()
        return (t - self.t0) * 1000

    def head(self, t=None):
        if self.r["ttfb_ms"] is None:
            self.r["ttfb_ms"] = self.now() if t is None else t

    def event(self, content, t=None):
        """An event seen at t (now when None): counts it; content: its generated text."""
        t = self.now() if t is None else t
        self.head(t)
        self.r["events"] += 1
        if content:
            if self.r["ttft_ms"] is None:
                self.r["ttft_ms"] = t
            self.r["content_times_ms"].append(t)

    def usage(self, input_tokens=None, output_tokens=None, cached=None, reasoning=None):
        for k, v in (("input_tokens", input_tokens), ("output_tokens", output_tokens),
                     ("cached_tokens", cached), ("reasoning_tokens", reasoning)):
            if v is not None:
                self.r[k] = v


def attr(obj, *names):
    """obj.a.b... or None where any is missing."""
    for n in names:
        if obj is None:
            return None
        obj = getattr(obj, n, None)
    return obj


def wait_of(fingerprint):
    """The test server's own wait before its answer ("wait_ms=..."), or None."""
    if fingerprint and fingerprint.startswith("wait_ms="):
        return float(fingerprint[len("wait_ms="):])
    return None


def openai_chat(client, model, stream, c):
    kw = dict(model=model, messages=[{"role": "user", "content": PROMPT}])
    if not stream:
        c.t0 = time.perf_counter()
        r = client.chat.completions.create(**kw)
        c.event(r.choices[0].message.content if r.choices else None)
        c.r["response_model"] = r.model
        c.r["finish_reason"] = r.choices[0].finish_reason if r.choices else None
        chat_usage(c, r.usage)
        return
    c.t0 = time.perf_counter()
    for ch in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        t = c.now()
        first = c.r["events"] == 0
        content = ch.choices[0].delta.content if ch.choices and ch.choices[0].delta else None
        c.event(content, t)
        if first:
            c.r["server_wait_ms"] = wait_of(ch.system_fingerprint)
        c.r["response_model"] = ch.model
        if ch.choices and ch.choices[0].finish_reason:
            c.r["finish_reason"] = ch.choices[0].finish_reason
        if ch.usage:
            chat_usage(c, ch.usage)


def chat_usage(c, u):
    if u:
        c.usage(u.prompt_tokens, u.completion_tokens, attr(u, "prompt_tokens_details", "cached_tokens"),
                attr(u, "completion_tokens_details", "reasoning_tokens"))


def responses_usage(c, resp):
    u = attr(resp, "usage")
    if u:
        c.usage(u.input_tokens, u.output_tokens, attr(u, "input_tokens_details", "cached_tokens"),
                attr(u, "output_tokens_details", "reasoning_tokens"))


def openai_responses(client, model, stream, c):
    if not stream:
        c.t0 = time.perf_counter()
        r = client.responses.create(model=model, input=PROMPT)
        c.event(r.output_text)
        c.r["response_model"] = r.model
        c.r["finish_reason"] = r.status
        responses_usage(c, r)
        return
    c.t0 = time.perf_counter()
    for ev in client.responses.create(model=model, input=PROMPT, stream=True):
        t = c.now()
        c.event(ev.delta if ev.type == "response.output_text.delta" else None, t)
        resp = getattr(ev, "response", None)
        if resp is not None:
            c.r["response_model"] = resp.model
            c.r["finish_reason"] = resp.status
            responses_usage(c, resp)


def anthropic_messages(client, model, stream, c):
    kw = dict(model=model, max_tokens=64, messages=[{"role": "user", "content": PROMPT}])
    if not stream:
        c.t0 = time.perf_counter()
        m = client.messages.create(**kw)
        c.event("".join(b.text for b in m.content if b.type == "text"))
        c.r["response_model"] = m.model
        c.r["finish_reason"] = m.stop_reason
        c.usage(m.usage.input_tokens, m.usage.output_tokens, m.usage.cache_read_input_tokens)
        return
    c.t0 = time.perf_counter()
    for ev in client.messages.create(stream=True, **kw):
        t = c.now()
        text = None
        if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
            text = ev.delta.text
        c.event(text, t)
        if ev.type == "message_start":
            u = ev.message.usage
            c.r["response_model"] = ev.message.model
            c.usage(u.input_tokens, None, u.cache_read_input_tokens)
        elif ev.type == "message_delta":
            c.r["finish_reason"] = ev.delta.stop_reason
            c.usage(None, ev.usage.output_tokens)


def ollama(http, base, model, stream, c, chat):
    body = {"model": model, "stream": stream}
    if chat:
        url = base + "/api/chat"
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        url = base + "/api/generate"
        body["prompt"] = PROMPT

    def line(obj, t):
        c.event(obj.get("message", {}).get("content") if chat else obj.get("response"), t)
        c.r["response_model"] = obj.get("model")
        if obj.get("done"):
            c.r["finish_reason"] = obj.get("done_reason")
            c.usage(obj.get("prompt_eval_count"), obj.get("eval_count"))

    c.t0 = time.perf_counter()
    with http.stream("POST", url, json=body) as resp:
        c.head()
        resp.raise_for_status()
        for text in resp.iter_lines():
            if text.strip():
                line(json.loads(text), c.now())


def gemini_chunk(c, obj, t):
    cands = obj.get("candidates") or [{}]
    cand = cands[0]
    parts = (cand.get("content") or {}).get("parts") or []
    c.event("".join(p.get("text", "") for p in parts), t)
    c.r["response_model"] = obj.get("modelVersion", c.r["response_model"])
    if cand.get("finishReason"):
        c.r["finish_reason"] = cand["finishReason"]
    u = obj.get("usageMetadata")
    if u:
        c.usage(u.get("promptTokenCount"), u.get("candidatesTokenCount"), u.get("cachedContentTokenCount"),
                u.get("thoughtsTokenCount"))


def gemini(http, base, model, stream, c, sse):
    body = {"contents": [{"role": "user", "parts": [{"text": PROMPT}]}]}
    verb = "streamGenerateContent" if stream else "generateContent"
    url = "%s/v1beta/models/%s:%s" % (base, model, verb)
    if stream and sse:
        url += "?alt=sse"
    c.t0 = time.perf_counter()
    with http.stream("POST", url, json=body) as resp:
        c.head()
        resp.raise_for_status()
        if not stream:
            resp.read()
            gemini_chunk(c, json.loads(resp.content), c.now())
        elif sse:
            # Server-sent events: data lines until a blank line, one event.
            data = []
            for text in resp.iter_lines():
                if text.startswith("data:"):
                    data.append(text[5:][1:] if text[5:6] == " " else text[5:])
                elif not text.strip() and data:
                    gemini_chunk(c, json.loads("\n".join(data)), c.now())
                    data = []
            if data:
                gemini_chunk(c, json.loads("\n".join(data)), c.now())
        else:
            # A JSON array as it streams: each element as soon as it is whole.
            dec = json.JSONDecoder()
            utf8 = codecs.getincrementaldecoder("utf-8")()
            buf = ""
            for raw in resp.iter_bytes():
                buf += utf8.decode(raw)
                while True:
                    buf = buf.lstrip(" \t\r\n[,]")
                    if not buf:
                        break
                    try:
                        obj, end = dec.raw_decode(buf)
                    except ValueError:
                        break  # not whole yet
                    gemini_chunk(c, obj, c.now())
                    buf = buf[end:]


def warm(models, type_, value):
    """Builds what the SDK's parse of type_ builds on first use (its
    discriminated-union table), with a sample value, before any timing."""
    try:
        models.construct_type(type_=type_, value=value)
    except Exception:  # an SDK without it: the first call's parse pays
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--plain", action="store_true", help="http (default https, not verified)")
    ap.add_argument("--api", required=True, choices=["chat", "responses", "azure", "anthropic", "ollama-chat",
                                                     "ollama-generate", "gemini", "gemini-sse"])
    ap.add_argument("--model", action="append", required=True, help="repeatable: a call each, in order")
    ap.add_argument("--prefix", default="", help="a base path before the API's, e.g. /gw/openai")
    ap.add_argument("--no-stream", action="store_true")
    ap.add_argument("--strict", action="store_true",
                    help="the SDKs validate every answer against their types (a missing field fails)")
    a = ap.parse_args()
    ports = []
    real_connect = socket.socket.connect

    def connect(self, addr):
        real_connect(self, addr)
        ports.append(self.getsockname()[1])

    # The HTTP client connects deep inside; note each socket's local port.
    socket.socket.connect = connect
    # And when each write leaves (the TLS handshake's are not these calls).
    for cls in (socket.socket, ssl.SSLSocket):
        for name in ("send", "sendall"):
            setattr(cls, name, noting_writes(getattr(cls, name)))
    # And when each read returns (the handshake's are before the call's t0).
    patch_reads(socket, ssl)
    scheme = "http" if a.plain else "https"
    base = "%s://127.0.0.1:%d%s" % (scheme, a.port, a.prefix.rstrip("/"))
    stream = not a.no_stream
    strict = {"_strict_response_validation": True} if a.strict else {}

    if a.api in ("chat", "responses", "azure"):
        import openai
        http = openai.DefaultHttpxClient(verify=False)
        if a.api == "azure":
            clients = {}

            def call(model, c):
                # One client a deployment, as Azure names the model in the path;
                # all on the one HTTP client, so its one pooled connection.
                if model not in clients:
                    clients[model] = openai.AzureOpenAI(azure_endpoint=base, api_key="k", api_version="2024-10-21",
                                                        azure_deployment=model, max_retries=0, http_client=http,
                                                        **strict)
                    clients[model].chat.completions  # imported on first touch
                openai_chat(clients[model], model, stream, c)
        else:
            client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, http_client=http, **strict)
            fn = openai_chat if a.api == "chat" else openai_responses
            # Its resources are imported on first touch: before any timing.
            if a.api == "chat":
                client.chat.completions
            else:
                client.responses
                from openai import _models
                from openai.types.responses import ResponseStreamEvent
                warm(_models, ResponseStreamEvent, {"type": "response.created"})

            def call(model, c):
                fn(client, model, stream, c)
    elif a.api == "anthropic":
        import anthropic
        client = anthropic.Anthropic(base_url=base, api_key="k", max_retries=0,
                                     http_client=anthropic.DefaultHttpxClient(verify=False), **strict)
        client.messages  # imported on first touch: before any timing
        from anthropic import _models
        from anthropic.types import RawMessageStreamEvent
        warm(_models, RawMessageStreamEvent, {"type": "message_start"})

        def call(model, c):
            anthropic_messages(client, model, stream, c)
    else:
        http = httpx.Client(verify=False, timeout=60)

        def call(model, c):
            if a.api.startswith("ollama"):
                ollama(http, base, model, stream, c, a.api == "ollama-chat")
            else:
                gemini(http, base, model, stream, c, a.api == "gemini-sse")

    for model in a.model:
        c = Call(a.api, model)
        call(model, c)
        c.r["local_port"] = ports[-1] if ports else None
        c.r["connections"] = len(ports)
        c.r["request_sent_ms"] = (SENT[0] - c.t0) * 1000 if SENT else None
        for k in ("ttfb_ms", "ttft_ms", "request_sent_ms", "server_wait_ms"):
            if c.r[k] is not None:
                c.r[k] = round(c.r[k], 3)
        c.r["content_times_ms"] = [round(t, 3) for t in c.r["content_times_ms"]]
        print(json.dumps(c.r), flush=True)


if __name__ == "__main__":
    main()
