#!/usr/bin/env python3
"""Python clients for tests/tests/secrets.rs, each sending known secrets: a
bearer token (Authorization), a cookie, an API key header, a query string
and a prompt in the body, to BASE (https:// certificates are not verified).

  stdlib     urllib.request: POST BASE/v1/chat/completions
  httpx      httpx (--http2: HTTP/2 by ALPN): the same POST, streamed
  openai     the official openai SDK: api_key as the bearer token, a chat
             completion, then the same streamed (--http2 on its httpx)
  anthropic  the official anthropic SDK: api_key as x-api-key, a message

Prints one JSON line: its pid and whether every answer carried --reply (the
server's secret): the secrets went through, both ways.
"""
import argparse
import json
import os
import ssl
import urllib.request


def stdlib(a):
    url = "%s/v1/chat/completions?api_key=%s" % (a.base, a.query)
    body = json.dumps({"model": "stdlib-model",
                       "messages": [{"role": "user", "content": a.prompt}]}).encode()
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json",
        "Authorization": "Bearer " + a.bearer,
        "Cookie": "session=" + a.cookie,
        "X-Api-Key": a.api_key,
    })
    ctx = ssl._create_unverified_context()
    with urllib.request.urlopen(req, context=ctx) as r:
        return [r.read().decode()]


def with_httpx(a):
    import httpx

    with httpx.Client(http2=a.http2, verify=False) as c:
        body = {"model": "httpx-model", "stream": True,
                "messages": [{"role": "user", "content": a.prompt}]}
        with c.stream("POST", "%s/v1/chat/completions" % a.base, json=body,
                      params={"api_key": a.query},
                      headers={"Authorization": "Bearer " + a.bearer,
                               "Cookie": "session=" + a.cookie,
                               "X-Api-Key": a.api_key}) as r:
            text = r.read().decode()
            assert r.http_version == ("HTTP/2" if a.http2 else "HTTP/1.1"), r.http_version
            return [text]


def with_openai(a):
    import openai

    client = openai.OpenAI(
        api_key=a.bearer, base_url=a.base + "/v1", max_retries=0,
        default_headers={"Cookie": "session=" + a.cookie, "api-key": a.api_key},
        default_query={"api_key": a.query},
        http_client=openai.DefaultHttpxClient(verify=False, http2=a.http2))
    msgs = [{"role": "user", "content": a.prompt}]
    one = client.chat.completions.create(model="openai-model", messages=msgs)
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(model="openai-model", messages=msgs, stream=True)
        if c.choices)
    return [one.choices[0].message.content, streamed]


def with_anthropic(a):
    import anthropic

    client = anthropic.Anthropic(
        api_key=a.api_key, base_url=a.base, max_retries=0,
        default_headers={"Cookie": "session=" + a.cookie, "Authorization": "Bearer " + a.bearer},
        default_query={"key": a.query},
        http_client=anthropic.DefaultHttpxClient(verify=False))
    m = client.messages.create(model="claude-model", max_tokens=16,
                               messages=[{"role": "user", "content": a.prompt}])
    return [m.content[0].text]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["stdlib", "httpx", "openai", "anthropic"])
    ap.add_argument("--base", required=True)
    ap.add_argument("--http2", action="store_true")
    for k in ["bearer", "cookie", "api-key", "query", "prompt", "reply"]:
        ap.add_argument("--" + k, required=True)
    a = ap.parse_args()
    answers = {"stdlib": stdlib, "httpx": with_httpx, "openai": with_openai,
               "anthropic": with_anthropic}[a.mode](a)
    print(json.dumps({"pid": os.getpid(), "answers": len(answers),
                      "replied": all(a.reply in t for t in answers)}), flush=True)


if __name__ == "__main__":
    main()
