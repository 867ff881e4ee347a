//! The `"kind": "request"` record: one HTTP/1.x request and its answer.

use std::{net::IpAddr, sync::Arc};

use serde::Serialize;

use super::{
    exchange::{Cut, Exchange},
    gen_ai::Call,
    head::Head,
    trace_context::{Hex, SpanId, SpanIds, TraceId, TraceParent},
};
use crate::{
    clock::Clock,
    record::{ConnRecord, Direction, Host},
    units::{fmt_bytes, fmt_ns, fmt_time},
};

#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct StreamStats {
    /// Server-sent events (null when a read was too long to be copied whole).
    pub events: Option<u32>,
    /// Request start -> the first event.
    pub first_event_ns: Option<u64>,
    pub mean_gap_ns: Option<u64>,
    pub max_gap_ns: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct GenAi {
    pub provider: &'static str,
    pub operation: &'static str,
    pub request_model: Option<String>,
    pub response_model: Option<String>,
    pub stream: bool,
    /// From the usage the server sent; null when it sent none.
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// Input tokens read from the provider's prompt cache, as it counted
    /// them (OpenAI's `cached_tokens`, Anthropic's `cache_read_input_tokens`,
    /// Gemini's `cachedContentTokenCount`); null when it sent none.
    pub cached_input_tokens: Option<u64>,
    /// Output tokens spent on reasoning, as the server counted them.
    pub reasoning_output_tokens: Option<u64>,
    /// Request start -> the first event delivered whole that carried
    /// generated content (answer text, reasoning, tool-call arguments; a
    /// role-only or empty chunk is not one); for an answer not streamed,
    /// the end of its JSON.
    pub time_to_first_token_ns: Option<u64>,
    pub finish_reason: Option<String>,
    /// Events (or NDJSON lines) that carried generated content.
    pub content_events: u32,
    /// Gaps between content events after the first (null: fewer than two).
    pub content_gaps: Option<GapStats>,
    /// First content event -> last, over the output tokens less one.
    pub time_per_output_token_ns: Option<u64>,
    /// Output tokens per second after the first token (the inverse).
    pub output_tokens_per_second: Option<f64>,
    /// Events whose JSON could not be read (skipped, counted).
    pub unreadable_events: u32,
}

/// The gaps between a call's content events.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct GapStats {
    pub count: u32,
    pub mean_ns: u64,
    /// Quantiles from a histogram within 1.6% of the true gap.
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
}

/// A gRPC call: the RPC conventions' fields and what its frames showed.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct RpcRecord {
    /// Always "grpc".
    pub system: &'static str,
    pub service: Option<String>,
    pub method: Option<String>,
    /// From the trailers (or a trailers-only answer); null when none came.
    pub grpc_status: Option<u32>,
    pub grpc_message: Option<String>,
    /// Length-prefixed messages each way; null when a prefix fell among
    /// bytes not copied.
    pub request_messages: Option<u32>,
    pub response_messages: Option<u32>,
    /// Request start -> the first answer message.
    pub time_to_first_message_ns: Option<u64>,
}

#[derive(Clone, Debug, Serialize, schemars::JsonSchema)]
pub struct RequestRecord {
    /// Always "request".
    #[schemars(extend("const" = "request"))]
    pub kind: &'static str,
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub comm: Option<Arc<str>>,
    pub exe: Option<Arc<str>>,
    /// The process's container and Kubernetes pod (null: none).
    pub container: Option<Arc<crate::k8s::Container>>,
    pub direction: Direction,
    pub local_addr: IpAddr,
    pub local_port: u16,
    pub remote_addr: IpAddr,
    pub remote_port: u16,
    /// "http/1.1" or "h2".
    pub protocol: &'static str,
    /// HTTP/2: the stream's id (null for HTTP/1.x).
    pub stream_id: Option<u32>,
    /// HTTP/2: a header block of this stream could not be decoded (an
    /// earlier one was not seen whole, so the peer's HPACK table is unknown):
    /// method, path, host, status and content type are then null.
    pub headers_undecodable: bool,
    /// HTTP/2: the error code of the RST_STREAM that ended the stream.
    pub reset_code: Option<u32>,
    /// 1 for the connection's first request; null when the probes came in
    /// after its start (earlier requests were not seen).
    pub request_index: Option<u32>,
    pub method: Option<String>,
    /// Without its query unless `--http-query` asks for it.
    pub path: Option<String>,
    pub host: Option<String>,
    pub status: Option<u16>,
    pub content_type: Option<String>,
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    pub duration_ns: u64,
    pub request_bytes: u64,
    pub response_bytes: u64,
    /// First byte of the request -> first byte of the answer.
    pub ttfb_ns: Option<u64>,
    pub streamed: bool,
    pub stream: Option<StreamStats>,
    pub gen_ai: Option<GenAi>,
    /// A gRPC call (null for other requests).
    pub rpc: Option<RpcRecord>,
    pub gpu: Option<crate::gpu::GpuRecord>,
    /// `observer.diagnosis.cause`, judged once (see `ConnRecord::diagnosis`).
    #[serde(skip)]
    pub diagnosis: Option<&'static str>,
    /// null, "incomplete" (the connection closed before the answer ended),
    /// "reset", "no response", "peer_closed" (sent after the peer had
    /// closed the connection: no answer came), or for HTTP/2
    /// "reset_stream" (RST_STREAM) and "goaway" (the peer's GOAWAY left the
    /// stream unprocessed, or came before it was sent).
    pub error: Option<&'static str>,
    /// A leg a proxy made for a request it served: which rule linked it
    /// (`trace_context`, `thread`, `request_match`); null: not a leg.
    pub link_rule: Option<&'static str>,
    /// The legs linked to this (inbound) request; null: none.
    pub upstream: Option<Vec<super::proxy::UpstreamLeg>>,
    /// With legs: this request's time outside them (the proxy's own).
    pub own_time_ns: Option<u64>,
    /// The request's place in a trace: `trace_id`, `span_id`,
    /// `parent_span_id` and `trace_state` (see [`Trace`]).
    #[serde(flatten)]
    pub trace: Trace,
    /// The connection's identity (see [`ConnRecord::conn_key`]): its first
    /// request's trace is the one later requests link to.
    #[serde(skip)]
    pub conn_key: u64,
    /// On the connection's first request: the connection as it stood, whose
    /// phases (lookup, connect, TLS handshake) that request's trace shows.
    #[serde(skip)]
    pub connection: Option<Box<ConnRecord>>,
}

/// A request's place in a trace: the application's when the request
/// carried a `traceparent` (our span is then the child of the caller's);
/// a server's record of a request whose client is on this host and seen
/// is the child of the client's record.
#[derive(Clone, Debug, Default, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Trace {
    /// 32 lowercase hex digits (null: the record was not placed).
    pub trace_id: Option<Hex<16>>,
    pub span_id: Option<Hex<8>>,
    /// The span this one is a child of (null: a trace's root).
    pub parent_span_id: Option<Hex<8>>,
    /// The request's `tracestate`, passed on into the span.
    pub trace_state: Option<String>,
    /// The request's valid `traceparent`, as read.
    #[serde(skip)]
    pub incoming: Option<TraceParent>,
    /// The trace and root span of the connection's first request, which a
    /// later request links to.
    #[serde(skip)]
    pub first_request: Option<(TraceId, SpanId)>,
}

impl Trace {
    /// The ids given, with what the request carried.
    pub fn set(&mut self, ids: SpanIds) {
        self.trace_id = Some(Hex(ids.trace_id));
        self.span_id = Some(Hex(ids.span_id));
        self.parent_span_id = ids.parent_span_id.map(Hex);
    }

    /// The trace id and span id, when placed.
    pub fn ids(&self) -> Option<(TraceId, SpanId)> {
        Some((self.trace_id?.0, self.span_id?.0))
    }
}

fn after(start: u64, t: u64) -> Option<u64> {
    (t != 0 && t >= start).then(|| t - start)
}

fn gen_ai(x: &Exchange, c: &Call, provider: &'static str, operation: &'static str) -> GenAi {
    let g = &c.gaps;
    let per_token = c.time_per_output_token_ns();
    GenAi {
        provider,
        operation,
        request_model: c.request_model.clone(),
        response_model: c.response_model.clone(),
        stream: c.stream.unwrap_or(false) || x.stream.is_some(),
        input_tokens: c.input_tokens,
        output_tokens: c.output_tokens,
        cached_input_tokens: c.cached_input_tokens,
        reasoning_output_tokens: c.reasoning_output_tokens,
        time_to_first_token_ns: after(x.start_ns, c.first_content_ns),
        finish_reason: c.finish_reason.clone(),
        content_events: c.content_events,
        content_gaps: (g.count > 0).then(|| GapStats {
            count: g.count,
            mean_ns: g.mean_ns().unwrap_or_default(),
            p50_ns: g.quantile_ns(0.5).unwrap_or_default(),
            p99_ns: g.quantile_ns(0.99).unwrap_or_default(),
            max_ns: g.max_ns,
        }),
        time_per_output_token_ns: per_token,
        output_tokens_per_second: per_token.map(|ns| 1e9 / ns as f64),
        unreadable_events: c.unreadable_events,
    }
}

/// The exchange's error: its own, else what the cut left it (no answer,
/// or an answer cut short).
fn exchange_error(
    x: &Exchange,
    cut: Option<Cut>,
    resp: Option<&Head>,
    conn: &ConnRecord,
    clock: &Clock,
) -> Option<&'static str> {
    // Sent after the peer's FIN: to a connection it had already closed.
    let sent_after_close = conn
        .peer_fin_unix_ns
        .is_some_and(|fin| clock.to_unix_ns(x.start_ns) >= fin);
    match (cut, resp) {
        _ if x.error.is_some() => x.error,
        (None, _) => None,
        (Some(_), None) if sent_after_close => Some("peer_closed"),
        (Some(_), None) => Some("no response"),
        (Some(_), Some(_)) if conn.resets > 0 => Some("reset"),
        (Some(_), Some(_)) => Some("incomplete"),
    }
}

/// The request head's method, path (with its query when kept), host and
/// trace context.
fn request_fields(
    req: Option<Head>,
    keep_query: bool,
) -> (Option<String>, Option<String>, Option<String>, Trace) {
    let Some(mut h) = req else {
        return (None, None, None, Trace::default());
    };
    let path = h.path.take().map(|p| match (&h.query, keep_query) {
        (Some(q), true) => format!("{p}?{q}"),
        _ => p,
    });
    let trace = Trace {
        trace_state: h.tracestate,
        incoming: h.traceparent,
        ..Trace::default()
    };
    (h.method, path, h.host, trace)
}

fn protocol(x: &Exchange) -> &'static str {
    if x.stream_id.is_some() {
        "h2"
    } else {
        "http/1.1"
    }
}

fn stream_stats(x: &Exchange) -> Option<StreamStats> {
    x.stream.as_ref().map(|s| StreamStats {
        events: s.events,
        first_event_ns: after(x.start_ns, s.first_ns),
        mean_gap_ns: (s.gaps > 0).then(|| s.gap_sum_ns / u64::from(s.gaps)),
        max_gap_ns: (s.gaps > 0).then_some(s.gap_max_ns),
    })
}

fn rpc_record(x: &Exchange) -> Option<RpcRecord> {
    x.rpc.as_deref().map(|c| RpcRecord {
        system: "grpc",
        service: c.service.clone(),
        method: c.method.clone(),
        grpc_status: c.status,
        grpc_message: c.message.clone(),
        request_messages: c.messages[0].count(),
        response_messages: c.messages[1].count(),
        time_to_first_message_ns: after(x.start_ns, c.first_message_ns),
    })
}

impl RequestRecord {
    /// `conn`: the connection's record as it stood (owner and addresses).
    /// Takes the exchange: its heads' text moves into the record.
    /// The record of exchange `x` on `conn`; a connection's first request
    /// carries a copy of the connection's record (its trace shows the
    /// connection's phases).
    pub fn new(
        x: Exchange,
        cut: Option<Cut>,
        conn: &ConnRecord,
        clock: &Clock,
        keep_query: bool,
    ) -> Self {
        let first = x.index == Some(1);
        let mut r = Self::bare(x, cut, conn, clock, keep_query);
        if first {
            r.connection = Some(Box::new(conn.clone()));
        }
        r
    }

    /// `new` without the connection's record: for a caller that moves the
    /// record in itself rather than copy it.
    pub fn bare(
        mut x: Exchange,
        cut: Option<Cut>,
        conn: &ConnRecord,
        clock: &Clock,
        keep_query: bool,
    ) -> Self {
        let resp = x.response.take();
        let end_ns = x.last_ns.max(x.start_ns);
        let error = exchange_error(&x, cut, resp.as_ref(), conn, clock);
        let streamed = x.stream.is_some()
            || resp
                .as_ref()
                .is_some_and(|h| h.framing == super::head::Framing::Chunked);
        let (method, path, host, trace) = request_fields(x.request.take(), keep_query);
        let (status, content_type) = resp.map_or((None, None), |h| (h.status, h.content_type));
        Self {
            kind: "request",
            pid: conn.pid,
            tid: conn.tid,
            comm: conn.comm.clone(),
            exe: conn.exe.clone(),
            container: conn.container.clone(),
            direction: conn.direction,
            local_addr: conn.local_addr,
            local_port: conn.local_port,
            remote_addr: conn.remote_addr,
            remote_port: conn.remote_port,
            protocol: protocol(&x),
            stream_id: x.stream_id,
            headers_undecodable: x.headers_undecodable,
            reset_code: x.reset_code,
            request_index: x.index,
            method,
            path,
            host,
            status,
            content_type,
            start_unix_ns: clock.to_unix_ns(x.start_ns),
            end_unix_ns: clock.to_unix_ns(end_ns),
            duration_ns: end_ns - x.start_ns,
            request_bytes: x.request_bytes,
            response_bytes: x.response_bytes,
            ttfb_ns: after(x.start_ns, x.first_byte_ns),
            streamed,
            stream: stream_stats(&x),
            gen_ai: x
                .api
                .zip(x.call.as_deref())
                .map(|((p, o), c)| gen_ai(&x, c, p, o)),
            rpc: rpc_record(&x),
            gpu: None,
            diagnosis: None,
            error,
            link_rule: None,
            upstream: None,
            own_time_ns: None,
            trace,
            conn_key: conn.conn_key,
            connection: None,
        }
    }

    /// `server.address` and `server.port`: for a client, the Host it asked
    /// for (without its port) and the port it connected to; for a server,
    /// its own address and port.
    pub fn server(&self) -> (String, u16) {
        let (host, port) = self.server_end();
        (host.to_string(), port)
    }

    /// The server's end, borrowed: the Host header's name (a client's),
    /// else the address.
    pub fn server_end(&self) -> (Host<'_>, u16) {
        match self.direction {
            Direction::Outbound => (
                self.host
                    .as_deref()
                    .map(|h| Host::Name(h.rsplit_once(':').map_or(h, |(name, _)| name)))
                    .unwrap_or(Host::Ip(&self.remote_addr)),
                self.remote_port,
            ),
            Direction::Inbound => (Host::Ip(&self.local_addr), self.local_port),
        }
    }

    /// The line `observer watch` prints for it.
    pub fn text_line(&self) -> String {
        let dir = match self.direction {
            Direction::Outbound => "out",
            Direction::Inbound => "in",
        };
        let mut line = format!(
            "{:<13} {:<8} {:<16} {dir:<4} {} {} {} -> {} ttfb {} in {} ({} / {})",
            fmt_time(self.end_unix_ns),
            self.pid.map_or("-".into(), |p| p.to_string()),
            self.comm.as_deref().unwrap_or("-"),
            self.method.as_deref().unwrap_or("-"),
            self.host.as_deref().unwrap_or("-"),
            self.path.as_deref().unwrap_or("-"),
            self.status.map_or("-".into(), |s| s.to_string()),
            fmt_ns(self.ttfb_ns),
            fmt_ns(Some(self.duration_ns)),
            fmt_bytes(self.request_bytes),
            fmt_bytes(self.response_bytes),
        );
        if let Some(s) = &self.stream {
            line.push_str(&format!(
                "; {} events, gap mean {} max {}",
                s.events.map_or("?".into(), |n| n.to_string()),
                fmt_ns(s.mean_gap_ns),
                fmt_ns(s.max_gap_ns)
            ));
        }
        if let Some(g) = &self.gen_ai {
            line.push_str(&format!(
                "; {} {} {}: first token {}, tokens {} in / {} out",
                g.provider,
                g.operation,
                g.response_model
                    .as_deref()
                    .or(g.request_model.as_deref())
                    .unwrap_or("-"),
                fmt_ns(g.time_to_first_token_ns),
                g.input_tokens.map_or("-".into(), |n| n.to_string()),
                g.output_tokens.map_or("-".into(), |n| n.to_string()),
            ));
        }
        if let Some(r) = &self.rpc {
            line.push_str(&format!(
                "; grpc {} messages {} / {}, first {}",
                r.grpc_status.map_or("-".into(), |s| s.to_string()),
                r.request_messages.map_or("?".into(), |n| n.to_string()),
                r.response_messages.map_or("?".into(), |n| n.to_string()),
                fmt_ns(r.time_to_first_message_ns),
            ));
        }
        if let Some(e) = self.error {
            line.push_str(&format!(" [{e}]"));
        }
        line
    }
}
