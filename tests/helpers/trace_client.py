#!/usr/bin/env python3
"""An application that calls a server inside a trace of its own, as
applications instrumented with the OpenTelemetry SDK do.

  trace_client.py URL [--method GET|POST] [--h2 --cafile CERT] [--no-context]

With trace context (the default): the OpenTelemetry SDK's tracer (a
TracerProvider of the SDK, no exporter) starts a span "checkout" under the
context its W3C propagator extracts from a caller's headers (the caller's
span "upstream", also the SDK's, and its caller's `tracestate: vendor=v1`),
as a service in the middle of a trace does; then, inside "checkout", the
propagator injects the context into the request's headers
(`opentelemetry.propagate.inject`): `traceparent` names "checkout" as the
parent and `tracestate` passes "vendor=v1" on. With --no-context, no SDK
and no trace headers.

The request goes out with httpx (HTTP/1.1; with --h2 HTTP/2 over TLS, ALPN
h2), one request on one new connection. Prints one JSON line: pid,
local_port, http_version, stream_id (HTTP/2), status, the headers it sent
(traceparent, tracestate: null when none), what the server says it got
(helpers/trace_server.py), and the SDK span's trace_id, span_id (lowercase
hex) and trace_state (null without context).
"""
import argparse
import json
import os
import ssl
import sys

import httpx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--method", default="GET")
    ap.add_argument("--h2", action="store_true")
    ap.add_argument("--cafile")
    ap.add_argument("--no-context", action="store_true")
    a = ap.parse_args()

    verify = ssl.create_default_context(cafile=a.cafile) if a.cafile else True
    headers = {}
    out = {"pid": os.getpid(), "sdk_trace_id": None, "sdk_span_id": None, "sdk_trace_state": None}
    body = b'{"item": 42}' if a.method == "POST" else None
    with httpx.Client(http1=not a.h2, http2=a.h2, verify=verify, timeout=10) as client:
        if a.no_context:
            r = send(client, a, headers, body)
        else:
            from opentelemetry import propagate, trace
            from opentelemetry.sdk.trace import TracerProvider

            trace.set_tracer_provider(TracerProvider())
            tracer = trace.get_tracer("observer-tests")
            # The caller's headers, as this service would receive them.
            incoming = {}
            with tracer.start_as_current_span("upstream"):
                propagate.inject(incoming)
            incoming["tracestate"] = "vendor=v1"
            parent = propagate.extract(incoming)
            with tracer.start_as_current_span(
                    "checkout", context=parent, kind=trace.SpanKind.INTERNAL) as span:
                propagate.inject(headers)
                sc = span.get_span_context()
                out["sdk_trace_id"] = trace.format_trace_id(sc.trace_id)
                out["sdk_span_id"] = trace.format_span_id(sc.span_id)
                out["sdk_trace_state"] = sc.trace_state.to_header() or None
                r = send(client, a, headers, body)
    out.update(r)
    out["sent"] = {"traceparent": headers.get("traceparent"), "tracestate": headers.get("tracestate")}
    print(json.dumps(out), flush=True)


def send(client, a, headers, body):
    """One request; what came of it."""
    r = client.request(a.method, a.url, headers=headers, content=body)
    r.read()
    stream = r.extensions.get("network_stream")
    addr = stream.get_extra_info("client_addr") if stream else None
    return {
        "local_port": addr[1] if addr else None,
        "http_version": r.http_version,
        "stream_id": r.extensions.get("stream_id"),
        "status": r.status_code,
        "server_saw": r.json(),
    }


if __name__ == "__main__":
    sys.exit(main())
