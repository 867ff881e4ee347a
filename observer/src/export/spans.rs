//! A connection record as a trace: a root span for the connection and child
//! spans for its phases, under the observed process's resource; a lookup that
//! led to no connection as a trace of its own. Requests are
//! built with opentelemetry-proto directly: the SDK's tracer provider holds one
//! resource, and one request here carries many processes.

use std::borrow::Cow;

#[cfg(test)]
use super::span_wire::Span;
use super::{
    attrs::{error_type, Ids},
    span_wire::{
        i, s, Attr, Head, KeyValue, SpanBody, SpanId, SpanKind, SpanOut, StatusCode, TraceBatch,
        TraceId,
    },
};
use crate::{
    dns::DnsRecord,
    http::RequestRecord,
    record::{ConnRecord, Direction, Family, Host},
};

/// What goes out as a trace.
#[derive(Debug, Clone)]
pub enum Traced {
    /// Boxed once when the correlator emits it: it moves through two
    /// queues and a batch, and copying its 650 bytes at each step cost more
    /// than the allocation (bench/NOTES.md).
    Conn(Box<ConnRecord>),
    /// A lookup that led to no connection.
    Dns(Box<DnsRecord>),
    /// An HTTP request (an LLM API call among them).
    Request(Box<RequestRecord>),
}

/// The process behind a record.
struct Proc<'a> {
    pid: Option<u32>,
    comm: Option<&'a str>,
    exe: Option<&'a str>,
    container: Option<&'a crate::k8s::Container>,
}

impl Traced {
    fn process(&self) -> Proc<'_> {
        match self {
            Traced::Conn(r) => Proc {
                pid: r.pid,
                comm: r.comm.as_deref(),
                exe: r.exe.as_deref(),
                container: r.container.as_deref(),
            },
            Traced::Dns(r) => Proc {
                pid: Some(r.pid),
                comm: Some(&r.comm),
                exe: r.exe.as_deref(),
                container: r.container.as_deref(),
            },
            Traced::Request(r) => Proc {
                pid: r.pid,
                comm: r.comm.as_deref(),
                exe: r.exe.as_deref(),
                container: r.container.as_deref(),
            },
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.process().pid
    }
}

/// The process a record belongs to, as an OTel resource.
pub fn resource(r: &Traced, host: &str, service_name: Option<&str>) -> Vec<KeyValue> {
    let r = r.process();
    let exe_name = r
        .exe
        .and_then(|p| p.rsplit('/').next())
        .or(r.comm)
        .unwrap_or("unknown");
    let mut a = vec![
        s("service.name", service_name.unwrap_or(exe_name).to_owned()),
        s("process.executable.name", exe_name.to_owned()),
        s("host.name", host.to_owned()),
    ];
    if let Some(pid) = r.pid {
        a.push(i("process.pid", i64::from(pid)));
    }
    if let Some(exe) = r.exe {
        a.push(s("process.executable.path", exe.to_owned()));
    }
    if let Some(comm) = r.comm {
        a.push(s("process.command", comm.to_owned()));
    }
    if let Some(c) = r.container {
        for (k, v) in c.attributes() {
            a.push(s(k, v.to_owned()));
        }
    }
    a
}

/// The server's end of a connection: the name the client asked for, or the
/// address.
struct Ends<'a> {
    server: Host<'a>,
    server_port: u16,
}

fn ends(r: &ConnRecord) -> Ends<'_> {
    let name = r
        .tls
        .as_ref()
        .and_then(|t| t.server_name.as_deref())
        .or(r.dns.as_ref().map(|d| &*d.name));
    match r.direction {
        Direction::Outbound => Ends {
            server: name.map_or(Host::Ip(&r.remote_addr), Host::Name),
            server_port: r.remote_port,
        },
        Direction::Inbound => Ends {
            server: Host::Ip(&r.local_addr),
            server_port: r.local_port,
        },
    }
}

/// A client's side is a CLIENT span, a server's a SERVER span.
fn span_kind(d: Direction) -> SpanKind {
    match d {
        Direction::Outbound => SpanKind::Client,
        Direction::Inbound => SpanKind::Server,
    }
}

fn ip(a: &std::net::IpAddr) -> Attr<'_> {
    Attr::Host(Host::Ip(a))
}

/// The connection's spans, as values (tests).
#[cfg(test)]
pub fn spans(r: &ConnRecord, ids: &mut Ids) -> Vec<Span> {
    let mut out = Vec::new();
    conn_spans(r, ids, &mut out);
    out
}

/// The connection's spans: root first, then its phases, each inside the root.
pub fn conn_spans(r: &ConnRecord, ids: &mut Ids, out: &mut impl SpanOut) {
    let trace_id = ids.trace_id();
    let root_id = ids.span_id();
    let e = ends(r);
    // A lookup that led to the connection is part of it: the root starts there.
    let start = r
        .dns
        .as_ref()
        .map_or(r.start_unix_ns, |d| d.start_unix_ns.min(r.start_unix_ns));
    let end = r.end_unix_ns.unwrap_or_else(|| {
        // Open connections: up to the snapshot.
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(start, |d| d.as_nanos() as u64)
    });
    let mut error = r.error.map(error_type);
    if r.tls.as_ref().is_some_and(|t| t.handshake_error.is_some()) && error.is_none() {
        error = Some("tls_handshake_failed");
    }
    {
        let mut b = out.span(Head {
            trace_id,
            span_id: root_id,
            parent_span_id: None,
            name: format_args!("tcp {}:{}", e.server, e.server_port),
            kind: span_kind(r.direction),
            start_time_unix_nano: start,
            end_time_unix_nano: end.max(start),
        });
        conn_attributes(r, &e, error, ids, &mut b);
    }
    let window = Window {
        trace_id,
        parent: root_id,
        start,
        end,
    };
    if r.first_request.is_none() {
        phase_spans(r, &e, &window, ids, out);
    }
    if r.first_request.is_some_and(|f| f.waited) {
        return;
    }
    let wait = match &r.tls {
        Some(t) => t.ttfb_start_unix_ns.zip(t.ttfb_ns),
        None => match r.direction {
            Direction::Outbound => r.first_tx_unix_ns.zip(r.ttfb_ns),
            Direction::Inbound => r.first_rx_unix_ns.zip(r.ttfb_ns),
        },
    };
    if let Some((from, len)) = wait {
        window.child(ids, out, format_args!("wait first byte"), from, len);
    }
}

/// The connection span's attributes, link and status.
fn conn_attributes(
    r: &ConnRecord,
    e: &Ends<'_>,
    error: Option<&'static str>,
    ids: &mut Ids,
    b: &mut impl SpanBody,
) {
    b.attr("network.peer.address", ip(&r.remote_addr));
    b.int("network.peer.port", i64::from(r.remote_port));
    b.attr("network.local.address", ip(&r.local_addr));
    b.int("network.local.port", i64::from(r.local_port));
    b.str(
        "network.type",
        match r.family {
            Family::Ipv4 => "ipv4",
            Family::Ipv6 => "ipv6",
        },
    );
    b.str("network.transport", "tcp");
    b.attr("server.address", Attr::Host(e.server));
    b.int("server.port", i64::from(e.server_port));
    b.int("observer.tcp.retransmits", i64::from(r.retransmits));
    b.int("observer.bytes_sent", r.bytes_sent as i64);
    b.int("observer.bytes_received", r.bytes_received as i64);
    if r.direction == Direction::Inbound {
        b.attr("client.address", ip(&r.remote_addr));
        b.int("client.port", i64::from(r.remote_port));
    }
    if let Some(d) = &r.dns {
        b.str("dns.question.name", &d.name);
    }
    if let Some(srtt) = r.srtt_us {
        b.double("observer.tcp.srtt", f64::from(srtt) / 1e6);
    }
    // On TLS the socket's first byte back is the server's handshake flight:
    // only the `tls` object's first byte is the answer's.
    if let Some(t) = r.answer_ttfb_ns() {
        b.double("observer.ttfb", t as f64 / 1e9);
    }
    if let Some(t) = &r.tls {
        b.str("observer.tls.library", t.library.unwrap_or("none"));
        b.str("observer.tls.source", tls_source(t.source));
        if let Some(v) = t.version {
            b.str("tls.protocol.version", v);
        }
    }
    if let Some(et) = error {
        b.str("error.type", et);
    }
    gpu_attributes(r.gpu.as_ref(), b);
    b.str("observer.diagnosis.cause", crate::cause::cause_of_conn(r));
    // The first request's trace holds the connection's phases: this one
    // links there instead of repeating them.
    if let Some(f) = r.first_request {
        let (trace, span) = f.trace.unwrap_or_else(|| {
            (
                ids.connection_trace_id(r.conn_key),
                ids.connection_span_id(r.conn_key),
            )
        });
        b.link(
            trace,
            span,
            "observer.link",
            "first request, with the connection's phases",
        );
    }
    let code = if error.is_some() {
        StatusCode::Error
    } else {
        StatusCode::Unset
    };
    b.status(code, "");
}

/// Where a trace's child spans go: under `parent`, inside [start, end].
struct Window {
    trace_id: TraceId,
    parent: SpanId,
    start: u64,
    end: u64,
}

impl Window {
    /// A child span; its attributes follow through the returned body.
    fn child<'o, O: SpanOut>(
        &self,
        ids: &mut Ids,
        out: &'o mut O,
        name: std::fmt::Arguments<'_>,
        from: u64,
        len: u64,
    ) -> O::Body<'o> {
        // Children lie inside their parent.
        let from = from.clamp(self.start, self.end);
        let to = from.saturating_add(len).min(self.end.max(from));
        out.span(Head {
            trace_id: self.trace_id,
            span_id: ids.span_id(),
            parent_span_id: Some(self.parent),
            name,
            kind: SpanKind::Internal,
            start_time_unix_nano: from,
            end_time_unix_nano: to,
        })
    }
}

/// A connection's phases as child spans: the lookup that led to it, the
/// socket connect, the TLS handshake.
fn phase_spans(r: &ConnRecord, e: &Ends, w: &Window, ids: &mut Ids, out: &mut impl SpanOut) {
    if let Some(d) = &r.dns {
        let name = &*d.name;
        let mut b = w.child(
            ids,
            out,
            format_args!("DNS lookup {name}"),
            d.start_unix_ns,
            d.duration_ns,
        );
        b.str("dns.question.name", name);
        b.str("observer.dns.result", d.result);
    }
    if let Some(c) = r.connect_ns {
        let peer = Host::Ip(&r.remote_addr);
        let mut b = w.child(
            ids,
            out,
            format_args!("socket connect {peer}:{}", r.remote_port),
            r.start_unix_ns,
            c,
        );
        b.attr("network.peer.address", ip(&r.remote_addr));
        b.int("network.peer.port", i64::from(r.remote_port));
    }
    if let Some(t) = &r.tls {
        if let (Some(from), Some(len)) = (t.handshake_start_unix_ns, t.handshake_ns) {
            // A client's span runs from the TCP connection (its TLS setup
            // included), so the phases tile the connection as curl -w does.
            let setup = t.setup_ns.unwrap_or(0);
            let (from, len) = (from.saturating_sub(setup), len + setup);
            let server = e.server;
            let mut b = match r.direction {
                Direction::Outbound => w.child(
                    ids,
                    out,
                    format_args!("TLS client handshake {server}"),
                    from,
                    len,
                ),
                Direction::Inbound => {
                    w.child(ids, out, format_args!("TLS server handshake"), from, len)
                }
            };
            b.str("observer.tls.library", t.library.unwrap_or("none"));
            b.str("observer.tls.source", tls_source(t.source));
        }
    }
}

fn tls_source(s: crate::tls::TlsSource) -> &'static str {
    match s {
        crate::tls::TlsSource::Library => "library",
        crate::tls::TlsSource::Wire => "wire",
    }
}

/// A lookup of its own, as values (tests).
#[cfg(test)]
pub fn dns_spans(r: &DnsRecord, ids: &mut Ids) -> Vec<Span> {
    let mut out = Vec::new();
    lookup_span(r, ids, &mut out);
    out
}

/// A lookup of its own: one CLIENT span.
pub fn lookup_span(r: &DnsRecord, ids: &mut Ids, out: &mut impl SpanOut) {
    let name = &*r.name;
    let mut b = out.span(Head {
        trace_id: ids.trace_id(),
        span_id: ids.span_id(),
        parent_span_id: None,
        name: format_args!("DNS lookup {name}"),
        kind: SpanKind::Client,
        start_time_unix_nano: r.start_unix_ns,
        end_time_unix_nano: r.start_unix_ns + r.duration_ns,
    });
    b.str("dns.question.name", name);
    b.str("observer.dns.qtype", &r.qtype);
    b.str("observer.dns.result", r.result);
    b.str("observer.dns.source", r.source);
    if let Some(server) = &r.server {
        b.str("server.address", server);
        b.int("server.port", 53);
    }
    if let Some(t) = r.transport {
        b.str("network.transport", t);
    }
    if let Some(rcode) = &r.rcode {
        b.str("observer.dns.rcode", rcode);
    }
    if let Some(n) = r.retries {
        b.int("observer.dns.retries", i64::from(n));
    }
    if !r.answers.is_empty() {
        let answers: Vec<String> = r.answers.iter().map(ToString::to_string).collect();
        b.str("observer.dns.answers", &answers.join(","));
    }
    let failed = r.result != "ok";
    if failed {
        b.str("error.type", r.result);
        b.status(StatusCode::Error, r.result);
    }
}

/// The GPU the process used most during the span, as attributes.
fn gpu_attributes(gpu: Option<&crate::gpu::GpuRecord>, b: &mut impl SpanBody) {
    let Some(d) = gpu.and_then(|g| {
        g.devices
            .iter()
            .max_by_key(|d| d.utilization_gpu_pct_max.unwrap_or(0))
    }) else {
        return;
    };
    if let Some(id) = &d.uuid {
        b.str("hw.id", id);
    }
    if let Some(v) = d.utilization_gpu_pct_max {
        b.double("observer.gpu.utilization.max", f64::from(v) / 100.0);
    }
    if let Some(v) = d.utilization_gpu_pct_avg {
        b.double("observer.gpu.utilization.avg", v / 100.0);
    }
    if let Some(v) = d.process_used_memory_bytes {
        b.int("observer.gpu.process.memory.usage", v as i64);
    }
    if d.throttle_reasons != 0 {
        b.int("observer.gpu.throttle_reasons", d.throttle_reasons as i64);
    }
}

/// A request's spans, as values (tests).
#[cfg(test)]
pub fn request_spans(r: &RequestRecord, ids: &mut Ids) -> Vec<Span> {
    let mut out = Vec::new();
    write_request_spans(r, ids, &mut out);
    out
}

/// A request's span name: `{method}` (HTTP semantic conventions),
/// `{operation} {model}` for an LLM API call (GenAI conventions),
/// `{rpc.service}/{rpc.method}` for a gRPC call.
fn request_name(r: &RequestRecord) -> Cow<'_, str> {
    if let Some(rpc) = &r.rpc {
        return format!(
            "{}/{}",
            rpc.service.as_deref().unwrap_or("unknown"),
            rpc.method.as_deref().unwrap_or("unknown")
        )
        .into();
    }
    if let Some(g) = &r.gen_ai {
        return match &g.request_model {
            Some(m) => format!("{} {m}", g.operation).into(),
            None => g.operation.into(),
        };
    }
    r.method.as_deref().unwrap_or("HTTP").into()
}

/// A request's `error.type`, if it failed.
fn request_error(r: &RequestRecord) -> Option<Cow<'static, str>> {
    // The HTTP conventions: a server's 5xx, a client's 4xx and 5xx are errors.
    let bad_status = r.status.is_some_and(|st| match r.direction {
        Direction::Outbound => st >= 400,
        Direction::Inbound => st >= 500,
    });
    if let Some(e) = r.error {
        return Some(e.into());
    }
    if bad_status {
        return Some(r.status.unwrap_or(0).to_string().into());
    }
    r.rpc
        .as_ref()
        .and_then(|rpc| rpc.grpc_status)
        .filter(|&c| grpc_error(c, r.direction))
        .map(|c| c.to_string().into())
}

/// A request as a trace: one span, CLIENT or SERVER, with a child for the
/// wait for the answer's first byte (and, for a connection's first request,
/// the connection's phases).
pub fn write_request_spans(r: &RequestRecord, ids: &mut Ids, out: &mut impl SpanOut) {
    // A connection's first request is the trace of the connection's set-up
    // too; later requests on it link to that trace.
    let first = r.connection.as_deref();
    // Placed by the correlator (the application's trace, or the one both
    // ends of a local call share); else a trace of its own.
    let (trace_id, root_id) = match (r.trace.ids(), first) {
        (Some(placed), _) => placed,
        (None, Some(_)) => (
            ids.connection_trace_id(r.conn_key),
            ids.connection_span_id(r.conn_key),
        ),
        (None, None) => (ids.trace_id(), ids.span_id()),
    };
    let parent_span_id = r.trace.parent_span_id.map(|p| p.0);
    let (server, port) = r.server_end();
    let error = request_error(r);
    // The first request's span starts with its connection's first phase.
    let start = first.map_or(r.start_unix_ns, |c| {
        c.dns
            .as_ref()
            .map_or(c.start_unix_ns, |d| d.start_unix_ns.min(c.start_unix_ns))
            .min(r.start_unix_ns)
    });
    let end = r.end_unix_ns.max(start);
    let name = request_name(r);
    {
        let mut b = out.span(Head {
            trace_id,
            span_id: root_id,
            parent_span_id,
            name: format_args!("{name}"),
            kind: span_kind(r.direction),
            start_time_unix_nano: start,
            end_time_unix_nano: end,
        });
        request_attributes(r, (server, port), error.as_deref(), ids, &mut b);
    }
    let window = Window {
        trace_id,
        parent: root_id,
        start,
        end,
    };
    if let Some(c) = first {
        phase_spans(c, &ends(c), &window, ids, out);
    }
    if let Some(t) = r.ttfb_ns {
        window.child(
            ids,
            out,
            format_args!("wait first byte"),
            r.start_unix_ns,
            t,
        );
    }
}

/// The request span's attributes, links and status.
fn request_attributes(
    r: &RequestRecord,
    (server, port): (Host<'_>, u16),
    error: Option<&str>,
    ids: &mut Ids,
    b: &mut impl SpanBody,
) {
    if let Some(ts) = &r.trace.trace_state {
        b.trace_state(ts);
    }
    b.str("http.request.method", r.method.as_deref().unwrap_or("HTTP"));
    b.attr("server.address", Attr::Host(server));
    b.int("server.port", i64::from(port));
    b.str(
        "network.protocol.version",
        if r.stream_id.is_some() { "2" } else { "1.1" },
    );
    b.int("observer.request_bytes", r.request_bytes as i64);
    b.int("observer.response_bytes", r.response_bytes as i64);
    if let Some(p) = &r.path {
        b.str("url.path", p);
        if r.direction == Direction::Inbound {
            b.str("http.route", &crate::http::route::template(p));
        }
    }
    if let Some(st) = r.status {
        b.int("http.response.status_code", i64::from(st));
    }
    if let Some(n) = r.request_index {
        b.int("observer.request_index", i64::from(n));
    }
    // Proxy legs: which rule made this span the child of the request
    // its process served; on that request, its own time outside them.
    if let Some(rule) = r.link_rule {
        b.str("observer.proxy.link_rule", rule);
    }
    if let Some(own) = r.own_time_ns {
        b.int("observer.proxy.own_time_ns", own as i64);
    }
    if let Some(id) = r.stream_id {
        b.int("observer.http2.stream_id", i64::from(id));
    }
    if let Some(code) = r.reset_code {
        b.int("observer.http2.reset_code", i64::from(code));
    }
    if let Some(n) = r.stream.as_ref().and_then(|st| st.events) {
        b.int("observer.stream.events", i64::from(n));
    }
    gpu_attributes(r.gpu.as_ref(), b);
    b.str(
        "observer.diagnosis.cause",
        crate::cause::cause_of_request(r),
    );
    if let Some(g) = &r.gen_ai {
        gen_ai_attributes(g, b);
    }
    if let Some(rpc) = &r.rpc {
        rpc_attributes(rpc, b);
    }
    if let Some(e) = error {
        b.str("error.type", e);
    }
    if matches!(r.request_index, Some(n) if n > 1) {
        let (trace, span) = r.trace.first_request.unwrap_or_else(|| {
            (
                ids.connection_trace_id(r.conn_key),
                ids.connection_span_id(r.conn_key),
            )
        });
        b.link(trace, span, "observer.link", "connection's first request");
    }
    if let Some(e) = error {
        b.status(StatusCode::Error, e);
    }
}

/// The RPC conventions' attributes of a gRPC call.
fn rpc_attributes(rpc: &crate::http::RpcRecord, b: &mut impl SpanBody) {
    b.str("rpc.system", rpc.system);
    if let Some(v) = &rpc.service {
        b.str("rpc.service", v);
    }
    if let Some(v) = &rpc.method {
        b.str("rpc.method", v);
    }
    if let Some(c) = rpc.grpc_status {
        b.int("rpc.grpc.status_code", i64::from(c));
    }
    if let Some(m) = &rpc.grpc_message {
        b.str("observer.rpc.grpc_message", m);
    }
    for (key, n) in [
        ("observer.rpc.request_messages", rpc.request_messages),
        ("observer.rpc.response_messages", rpc.response_messages),
    ] {
        if let Some(n) = n {
            b.int(key, i64::from(n));
        }
    }
    if let Some(t) = rpc.time_to_first_message_ns {
        b.double("observer.rpc.time_to_first_message", t as f64 / 1e9);
    }
}

/// The RPC conventions: any status but OK is a client's error; a server's
/// only UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE
/// and DATA_LOSS (the others are the caller's doing).
pub fn grpc_error(code: u32, dir: Direction) -> bool {
    match dir {
        Direction::Outbound => code != 0,
        Direction::Inbound => matches!(code, 2 | 4 | 12 | 13 | 14 | 15),
    }
}

/// Writes the records' spans into `batch`, one resource per process.
pub fn write_batch(
    records: &[Traced],
    host: &str,
    service_name: Option<&str>,
    ids: &mut Ids,
    batch: &mut TraceBatch,
) {
    for r in records {
        write_record(r, host, service_name, ids, batch);
    }
}

/// Writes one record's spans into `batch`, under its process's resource.
pub fn write_record(
    r: &Traced,
    host: &str,
    service_name: Option<&str>,
    ids: &mut Ids,
    batch: &mut TraceBatch,
) {
    let out = batch.spans_of(r.pid(), || resource(r, host, service_name));
    match r {
        Traced::Conn(c) => conn_spans(c, ids, out),
        Traced::Dns(d) => lookup_span(d, ids, out),
        Traced::Request(q) => write_request_spans(q, ids, out),
    }
}

/// The GenAI conventions' attributes of an LLM API call's span, and ours
/// for what they do not name (content gaps, per-token time).
fn gen_ai_attributes(g: &crate::http::GenAi, b: &mut impl SpanBody) {
    b.str("gen_ai.operation.name", g.operation);
    b.str("gen_ai.provider.name", g.provider);
    if let Some(m) = &g.request_model {
        b.str("gen_ai.request.model", m);
    }
    if let Some(m) = &g.response_model {
        b.str("gen_ai.response.model", m);
    }
    let counts = [
        ("gen_ai.usage.input_tokens", g.input_tokens),
        ("gen_ai.usage.output_tokens", g.output_tokens),
        (
            "gen_ai.usage.cache_read.input_tokens",
            g.cached_input_tokens,
        ),
        (
            "gen_ai.usage.reasoning.output_tokens",
            g.reasoning_output_tokens,
        ),
    ];
    for (key, n) in counts {
        if let Some(n) = n {
            b.int(key, n as i64);
        }
    }
    if let Some(reason) = &g.finish_reason {
        b.str("gen_ai.response.finish_reasons", reason);
    }
    if let Some(t) = g.time_to_first_token_ns {
        b.double("gen_ai.response.time_to_first_chunk", t as f64 / 1e9);
    }
    b.int(
        "observer.gen_ai.content_events",
        i64::from(g.content_events),
    );
    if let Some(gaps) = &g.content_gaps {
        for (key, ns) in [
            ("observer.gen_ai.gap.mean", gaps.mean_ns),
            ("observer.gen_ai.gap.p50", gaps.p50_ns),
            ("observer.gen_ai.gap.p99", gaps.p99_ns),
            ("observer.gen_ai.gap.max", gaps.max_ns),
        ] {
            b.double(key, ns as f64 / 1e9);
        }
    }
    if let Some(t) = g.time_per_output_token_ns {
        b.double("observer.gen_ai.time_per_output_token", t as f64 / 1e9);
    }
    if let Some(r) = g.output_tokens_per_second {
        b.double("observer.gen_ai.output_tokens_per_second", r);
    }
    if g.unreadable_events > 0 {
        b.int(
            "observer.gen_ai.unreadable_events",
            i64::from(g.unreadable_events),
        );
    }
    b.str(
        "gen_ai.request.stream",
        if g.stream { "true" } else { "false" },
    );
}

#[cfg(test)]
mod tests {
    use observer_common::{Conn, AF_INET, DIR_OUTBOUND, FLAG_ESTABLISHED, FLAG_OWNED};

    use super::*;
    use crate::{clock::Clock, record::State};

    /// The records' export request, as a collector decodes it.
    fn encoded(
        records: &[Traced],
    ) -> opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest {
        let mut batch = TraceBatch::default();
        write_batch(records, "h", None, &mut Ids::new(), &mut batch);
        let bytes = batch.encode();
        prost::Message::decode(bytes.as_slice()).expect("decodes")
    }

    /// A closed client connection to 10.0.0.1:80: connected in 2 µs, its
    /// first byte 5 µs after its first send.
    fn closed_client() -> ConnRecord {
        let mut c = Conn {
            start_ns: 1_000,
            established_ns: 3_000,
            first_tx_ns: 4_000,
            first_rx_ns: 9_000,
            end_ns: 10_000,
            dport: 80,
            family: AF_INET,
            direction: DIR_OUTBOUND,
            flags: FLAG_OWNED | FLAG_ESTABLISHED,
            pid: 42,
            ..Conn::default()
        };
        c.daddr[..4].copy_from_slice(&[10, 0, 0, 1]);
        ConnRecord::new(&c, None, &Clock::with_offset(0), State::Closed)
    }

    #[test]
    fn a_connection_is_a_root_with_phases_inside_it() {
        let r = closed_client();
        let s = spans(&r, &mut Ids::new());
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].name, "tcp 10.0.0.1:80");
        assert_eq!(s[0].kind, SpanKind::Client);
        assert!(s[0].parent_span_id.is_none());
        assert_eq!(
            (
                s[1].name.as_str(),
                s[1].start_time_unix_nano,
                s[1].end_time_unix_nano
            ),
            ("socket connect 10.0.0.1:80", 1_000, 3_000)
        );
        assert_eq!(
            (
                s[2].name.as_str(),
                s[2].start_time_unix_nano,
                s[2].end_time_unix_nano
            ),
            ("wait first byte", 4_000, 9_000)
        );
        for child in &s[1..] {
            assert_eq!(child.parent_span_id, Some(s[0].span_id));
            assert_eq!(child.trace_id, s[0].trace_id);
        }
        let req = encoded(&[Traced::Conn(Box::new(r.clone())), Traced::Conn(Box::new(r))]);
        assert_eq!(req.resource_spans.len(), 1, "one resource per process");
        assert_eq!(req.resource_spans[0].scope_spans[0].spans.len(), 6);
    }

    #[test]
    fn a_connection_whose_first_request_holds_its_phases_links_there() {
        let mut r = closed_client();
        let ids = &mut Ids::new();
        let first = (
            ids.connection_trace_id(r.conn_key),
            ids.connection_span_id(r.conn_key),
        );
        r.first_request = Some(crate::record::FirstRequest {
            waited: true,
            trace: None,
        });
        let s = spans(&r, ids);
        assert_eq!(s.len(), 1, "the root alone: {s:#?}");
        assert_eq!(s[0].links.len(), 1);
        assert_eq!((s[0].links[0].trace_id, s[0].links[0].span_id), first);
        assert_ne!(s[0].trace_id, first.0);
        // The request had no first byte of its own (an answer that was not
        // HTTP): the connection keeps its wait.
        r.first_request = Some(crate::record::FirstRequest {
            waited: false,
            trace: None,
        });
        let s = spans(&r, ids);
        let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["tcp 10.0.0.1:80", "wait first byte"]);
    }

    #[test]
    fn a_lookup_of_its_own_is_one_client_span_under_its_process() {
        let r = DnsRecord {
            kind: "dns",
            pid: 42,
            tid: 43,
            comm: "dig".into(),
            exe: Some("/usr/bin/dig".into()),
            container: None,
            name: "gone.test".into(),
            qtype: "A".into(),
            duration_ns: 5_000,
            result: "nxdomain",
            server: Some("10.0.0.53".into()),
            answers: vec![],
            start_unix_ns: 1_000,
            source: "wire",
            id: Some(7),
            rcode: Some("NXDOMAIN".into()),
            retries: Some(0),
            transport: Some("udp"),
            call: None,
        };
        let req = encoded(&[Traced::Dns(Box::new(r))]);
        let rs = &req.resource_spans[0];
        let attr = |kv: &[opentelemetry_proto::tonic::common::v1::KeyValue], k: &str| {
            kv.iter()
                .find(|a| a.key == k)
                .map(|a| format!("{:?}", a.value))
        };
        let res = &rs.resource.as_ref().expect("resource").attributes;
        assert!(attr(res, "service.name")
            .expect("service")
            .contains("\"dig\""));
        assert!(attr(res, "process.pid").expect("pid").contains("42"));
        let spans = &rs.scope_spans[0].spans;
        assert_eq!(spans.len(), 1);
        let s = &spans[0];
        assert_eq!(s.name, "DNS lookup gone.test");
        assert_eq!(s.kind, SpanKind::Client as i32);
        assert_eq!(
            (s.start_time_unix_nano, s.end_time_unix_nano),
            (1_000, 6_000)
        );
        assert!(attr(&s.attributes, "server.address")
            .expect("server")
            .contains("10.0.0.53"));
        assert!(attr(&s.attributes, "error.type")
            .expect("error")
            .contains("nxdomain"));
        assert_eq!(
            s.status.as_ref().map(|st| st.code),
            Some(StatusCode::Error as i32)
        );
    }
}
