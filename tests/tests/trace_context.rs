//! W3C trace context: an application instrumented with the OpenTelemetry
//! SDK (the Python SDK from PyPI) sends `traceparent` and `tracestate` on
//! its request, over HTTP/1.1 and over HTTP/2 (HPACK, TLS); our CLIENT
//! request span joins the application's trace as the child of the
//! application's span and carries its `tracestate`, and our SERVER span of
//! the same request (both ends on this host) is the child of our CLIENT
//! span. Without trace context a local call is one trace all the same. The
//! `--print` JSON request records carry the same ids as the OTLP spans.
//!
//! `observer run --json --print` exports OTLP/gRPC to the tests' own
//! receiver (tests/src/otlp.rs) and prints its records; the server
//! (helpers/trace_server.py) and the client (helpers/trace_client.py) are
//! fresh processes started after it, one request on one new connection.
//! Needs root (loads eBPF); see tests/src/lib.rs.

#![expect(clippy::unwrap_used, reason = "a panic is a test failure")]

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use opentelemetry_proto::tonic::{
    common::v1::KeyValue,
    trace::v1::{span::SpanKind, Span},
};
use serde_json::Value;
use tests::{otlp::*, *};

/// A file removed when dropped.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `observer run --json --print` exporting OTLP/gRPC to the test's
/// receiver, for connections on one port; its records go to a file.
struct Observed {
    daemon: Daemon,
    out: TempFile,
}

fn observe(test: &str, otlp_port: u16, server_port: u16) -> Observed {
    let out = TempFile(std::env::temp_dir().join(format!(
        "observer-trace-context-{test}-{}.jsonl",
        std::process::id()
    )));
    let mut cmd = Command::new(observer_bin());
    cmd.args(["run", "--json", "--print", "--prometheus-listen", "none"])
        .args(["--port", &server_port.to_string()])
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{otlp_port}"),
        );
    let daemon =
        Daemon::start_with_stdout(cmd, Stdio::from(std::fs::File::create(&out.0).unwrap()));
    Observed { daemon, out }
}

impl Observed {
    /// Stops the observer (every span exported, nothing dropped); the
    /// request records it printed.
    fn stop(self) -> Vec<Value> {
        let summary = summary_of(&self.daemon.stop());
        let export = &summary["export"];
        assert_eq!(export["export_errors"], 0, "{summary:#}");
        assert_eq!(export["records_dropped"], 0, "{summary:#}");
        std::fs::read_to_string(&self.out.0)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .filter(|r| r["kind"] == "request")
            .collect()
    }
}

/// helpers/trace_server.py on `port`: plain HTTP/1.1, or HTTP/2 over TLS
/// with `cert`.
fn trace_server(python: &Path, port: u16, cert: Option<&Cert>) -> HelperServer {
    let mut cmd = Command::new(python);
    cmd.arg(helper("trace_server.py"))
        .args(["--port", &port.to_string()]);
    if let Some(c) = cert {
        cmd.arg("--h2")
            .arg("--cert")
            .arg(c.cert())
            .arg("--key")
            .arg(c.key());
    }
    HelperServer::spawn(&mut cmd)
}

/// helpers/trace_client.py: one request, its one JSON line.
fn trace_client(python: &Path, url: &str, args: &[&str]) -> Value {
    let lines = run_json_lines(
        Command::new(python)
            .arg(helper("trace_client.py"))
            .arg(url)
            .args(args),
    );
    assert_eq!(lines.len(), 1, "{lines:?}");
    lines.into_iter().next().unwrap()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A span in one line: what a failure needs to show.
fn show(res: &[KeyValue], s: &Span) -> String {
    format!(
        "{:?} kind {} pid {:?} url.path {:?} trace {} span {} parent {:?} state {:?}",
        s.name,
        s.kind,
        attr_int(res, "process.pid"),
        attr_str(&s.attributes, "url.path"),
        hex(&s.trace_id),
        hex(&s.span_id),
        hex(&s.parent_span_id),
        s.trace_state
    )
}

/// The one request span of `kind` named `method` with `url.path` = `path`.
fn request_span<'a>(
    spans: &'a [(Vec<KeyValue>, Span)],
    kind: SpanKind,
    method: &str,
    path: &str,
) -> &'a (Vec<KeyValue>, Span) {
    let found: Vec<&(Vec<KeyValue>, Span)> = spans
        .iter()
        .filter(|(_, s)| {
            s.kind == kind as i32
                && s.name == method
                && attr_str(&s.attributes, "url.path").as_deref() == Some(path)
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {kind:?} span {method} {path}; all spans:\n{}",
        spans
            .iter()
            .map(|(r, s)| show(r, s))
            .collect::<Vec<_>>()
            .join("\n")
    );
    found[0]
}

/// The one request record seen from `direction` with `path`.
fn record<'a>(records: &'a [Value], direction: &str, path: &str) -> &'a Value {
    let found: Vec<&Value> = records
        .iter()
        .filter(|r| r["direction"] == direction && r["path"] == path)
        .collect();
    assert_eq!(found.len(), 1, "{direction} {path}: {records:#?}");
    found[0]
}

fn is_hex(v: &Value, digits: usize) -> bool {
    v.as_str().is_some_and(|s| {
        s.len() == digits && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
    })
}

/// A request record's ids are its span's: trace and span id, the parent
/// (null for a root) and the trace state (null when none).
fn record_matches_span(r: &Value, s: &Span) {
    assert!(is_hex(&r["trace_id"], 32), "trace_id: {r:#}");
    assert!(is_hex(&r["span_id"], 16), "span_id: {r:#}");
    assert!(
        r["parent_span_id"].is_null() || is_hex(&r["parent_span_id"], 16),
        "parent_span_id: {r:#}"
    );
    assert!(
        r["trace_state"].is_null() || r["trace_state"].is_string(),
        "trace_state: {r:#}"
    );
    assert_eq!(r["trace_id"], hex(&s.trace_id), "{r:#}");
    assert_eq!(r["span_id"], hex(&s.span_id), "{r:#}");
    let parent = (!s.parent_span_id.is_empty()).then(|| hex(&s.parent_span_id));
    assert_eq!(r["parent_span_id"], Value::from(parent), "{r:#}");
    let state = (!s.trace_state.is_empty()).then(|| s.trace_state.clone());
    assert_eq!(r["trace_state"], Value::from(state), "{r:#}");
}

/// What the application's SDK put in the request: its span's trace id and
/// span id, and the trace state.
struct FromSdk {
    trace_id: String,
    span_id: String,
    trace_state: String,
}

/// The client's line: the request went out with the SDK's context (or
/// none) and reached the server unchanged (the test's own premise).
fn sdk_context(c: &Value) -> Option<FromSdk> {
    assert_eq!(c["status"], 200, "{c:#}");
    assert_eq!(
        c["server_saw"]["traceparent"], c["sent"]["traceparent"],
        "{c:#}"
    );
    assert_eq!(
        c["server_saw"]["tracestate"], c["sent"]["tracestate"],
        "{c:#}"
    );
    let trace_id = c["sdk_trace_id"].as_str()?.to_owned();
    let span_id = c["sdk_span_id"].as_str().unwrap().to_owned();
    let sent = c["sent"]["traceparent"].as_str().unwrap();
    assert!(
        sent.starts_with(&format!("00-{trace_id}-{span_id}-")),
        "the SDK's traceparent names its span: {c:#}"
    );
    assert_eq!(c["sent"]["tracestate"], "vendor=v1", "{c:#}");
    Some(FromSdk {
        trace_id,
        span_id,
        trace_state: c["sdk_trace_state"].as_str().unwrap().to_owned(),
    })
}

/// One request of the client `c` (its line) to `server` at `path`, seen
/// from both ends: our CLIENT span in the SDK's trace as the child of the
/// SDK's span with its trace state (or, without context, a root of its
/// own); our SERVER span in the same trace, the child of our CLIENT span;
/// each under its process; the records' ids the spans'. Returns the
/// client's and the server's record.
fn one_trace<'a>(
    rec: &Received,
    records: &'a [Value],
    c: &Value,
    server: &HelperServer,
    method: &str,
    path: &str,
) -> (&'a Value, &'a Value) {
    let sdk = sdk_context(c);
    let spans = all_spans(rec);
    let (cres, client) = request_span(&spans, SpanKind::Client, method, path);
    let (sres, served) = request_span(&spans, SpanKind::Server, method, path);
    let (cshow, sshow) = (show(cres, client), show(sres, served));
    eprintln!("client span: {cshow}\nserver span: {sshow}");
    assert_eq!(
        attr_int(cres, "process.pid"),
        c["pid"].as_i64(),
        "the client's span under the client process: {cshow}"
    );
    assert_eq!(
        attr_int(sres, "process.pid"),
        Some(i64::from(server.pid())),
        "the server's span under the server process: {sshow}"
    );
    assert_eq!(client.trace_id.len(), 16, "{cshow}");
    assert_eq!(client.span_id.len(), 8, "{cshow}");
    assert_eq!(served.span_id.len(), 8, "{sshow}");
    assert_ne!(client.span_id, served.span_id, "{cshow}\n{sshow}");
    match &sdk {
        Some(sdk) => {
            assert_eq!(
                hex(&client.trace_id),
                sdk.trace_id,
                "our client span in the SDK's trace: {cshow}"
            );
            assert_eq!(
                hex(&client.parent_span_id),
                sdk.span_id,
                "our client span the child of the SDK's span: {cshow}"
            );
            assert_eq!(
                client.trace_state, sdk.trace_state,
                "our client span carries the request's tracestate: {cshow}"
            );
        }
        None => {
            assert!(
                client.parent_span_id.is_empty(),
                "without trace context our client span is the trace's root: {cshow}"
            );
            assert!(client.trace_state.is_empty(), "{cshow}");
        }
    }
    assert_eq!(
        served.trace_id, client.trace_id,
        "the server's span in the client's trace:\n{cshow}\n{sshow}"
    );
    assert_eq!(
        served.parent_span_id, client.span_id,
        "the server's span the child of our client span:\n{cshow}\n{sshow}"
    );

    let cr = record(records, "outbound", path);
    let sr = record(records, "inbound", path);
    assert_eq!(cr["pid"], c["pid"], "{cr:#}");
    assert_eq!(cr["local_port"], c["local_port"], "{cr:#}");
    assert_eq!(sr["remote_port"], c["local_port"], "{sr:#}");
    assert_eq!(sr["pid"], server.pid(), "{sr:#}");
    record_matches_span(cr, client);
    record_matches_span(sr, served);
    (cr, sr)
}

/// One plain HTTP/1.1 GET on this host, observed: what the receiver got,
/// the records printed, the client's line and the server.
struct PlainCall {
    rec: Received,
    records: Vec<Value>,
    client: Value,
    server: HelperServer,
}

impl PlainCall {
    fn one_trace(&self, path: &str) -> (&Value, &Value) {
        one_trace(
            &self.rec,
            &self.records,
            &self.client,
            &self.server,
            "GET",
            path,
        )
    }
}

/// A fresh server and a fresh client (trace_client.py with `args`) making
/// one GET of `path` under a fresh observer. None: the test cannot run here.
fn plain_call(test: &str, path: &str, args: &[&str]) -> Option<PlainCall> {
    let serial = begin(test, &["python3"])?;
    let python = otel_sdk_python(test)?;
    let (rec, otlp_port) = grpc_receiver();
    let port = free_port();
    let run = observe(test, otlp_port, port);
    let server = trace_server(&python, port, None);
    let client = trace_client(
        &python,
        &format!("http://127.0.0.1:{port}{path}"),
        &[&["--method", "GET"], args].concat(),
    );
    let records = run.stop();
    drop(serial);
    Some(PlainCall {
        rec,
        records,
        client,
        server,
    })
}

/// An application instrumented with the OpenTelemetry SDK calls a plain
/// HTTP/1.1 server on this host with the SDK's `traceparent` and
/// `tracestate`: our CLIENT span is the child of the SDK's span in its
/// trace, with its trace state; our SERVER span is the child of our CLIENT
/// span; the records say the same.
#[test]
fn an_sdk_traceparent_over_http1_puts_our_spans_in_its_trace() {
    let path = "/checkout/h1";
    let Some(call) = plain_call("trace_context_http1", path, &[]) else {
        return;
    };
    let c = &call.client;
    assert_eq!(c["http_version"], "HTTP/1.1", "{c:#}");
    let (cr, sr) = call.one_trace(path);
    for r in [cr, sr] {
        assert_eq!(r["protocol"], "http/1.1", "{r:#}");
        assert_eq!(r["method"], "GET", "{r:#}");
        assert_eq!(r["status"], 200, "{r:#}");
    }
}

/// The same over HTTP/2 (httpx with the h2 package over TLS, ALPN h2; the
/// headers in HPACK) to an HTTP/2 server of the tests' own on TLS (the h2
/// package over Python's ssl): a POST on stream 1 of the client's first
/// connection.
#[test]
fn an_sdk_traceparent_over_h2_puts_our_spans_in_its_trace() {
    let test = "trace_context_h2";
    let Some(_serial) = begin(test, &["python3", "openssl"]) else {
        return;
    };
    let Some(python) = otel_sdk_python(test) else {
        return;
    };
    let cert = Cert::new();
    let (rec, otlp_port) = grpc_receiver();
    let port = free_port();
    let run = observe(test, otlp_port, port);
    let server = trace_server(&python, port, Some(&cert));
    let path = "/checkout/h2";
    let cafile = cert.cert().display().to_string();
    let c = trace_client(
        &python,
        &format!("https://127.0.0.1:{port}{path}"),
        &["--method", "POST", "--h2", "--cafile", &cafile],
    );
    let records = run.stop();
    assert_eq!(c["http_version"], "HTTP/2", "{c:#}");
    assert_eq!(c["stream_id"], 1, "{c:#}");
    let (cr, sr) = one_trace(&rec, &records, &c, &server, "POST", path);
    for r in [cr, sr] {
        assert_eq!(r["protocol"], "h2", "{r:#}");
        assert_eq!(r["stream_id"], 1, "{r:#}");
        assert_eq!(r["method"], "POST", "{r:#}");
        assert_eq!(r["status"], 200, "{r:#}");
        assert_eq!(r["headers_undecodable"], false, "{r:#}");
    }
}

/// A plain HTTP/1.1 call on this host without any trace context is one
/// trace: our CLIENT span its root, our SERVER span its child; the records
/// carry the same ids, the client's with a null parent and no trace state.
#[test]
fn a_local_call_without_trace_context_is_one_trace() {
    let path = "/no/context";
    let Some(call) = plain_call("trace_context_none", path, &["--no-context"]) else {
        return;
    };
    let c = &call.client;
    assert_eq!(c["sent"]["traceparent"], Value::Null, "{c:#}");
    let (cr, sr) = call.one_trace(path);
    assert_eq!(cr["parent_span_id"], Value::Null, "{cr:#}");
    assert_eq!(cr["trace_state"], Value::Null, "{cr:#}");
    assert_eq!(sr["trace_id"], cr["trace_id"], "{sr:#}");
    assert_eq!(sr["parent_span_id"], cr["span_id"], "{sr:#}");
}
