//! Spans written straight into their OTLP protobuf encoding
//! (opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest), by
//! hand: the span builders (`spans.rs`) hand each span's fields to a
//! `SpanOut` as they work them out, and the encoder writes them at once,
//! borrowed. Building span values first (owned names, attribute vectors)
//! and freeing them after encoding was a third of the daemon's CPU under
//! connection churn (bench/NOTES.md). Tests collect the same calls into
//! `Span` values (`impl SpanOut for Vec<Span>`); a unit test checks the
//! encoder's bytes decode, with prost, to those values.

use std::{
    borrow::Cow,
    collections::HashMap,
    fmt::{self, Write as _},
};

use super::protowire::{
    attr_len, bytes_len, framed_len, put_attr, put_bytes, put_fixed64, put_key, put_varint,
    put_varint_field, varint_field_len, varint_len, AnyRef, LEN,
};
use crate::record::{push_ip, Host};

/// Text that is often a fixed name.
pub type Text = Cow<'static, str>;

/// An attribute's value, owned (resources; spans collected in tests).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(Text),
    Int(i64),
    Double(f64),
    Bool(bool),
}

#[derive(Debug, Clone, PartialEq)]
pub struct KeyValue {
    pub key: &'static str,
    pub value: Value,
}

pub fn s(key: &'static str, v: impl Into<Text>) -> KeyValue {
    KeyValue {
        key,
        value: Value::Str(v.into()),
    }
}

pub fn i(key: &'static str, v: i64) -> KeyValue {
    KeyValue {
        key,
        value: Value::Int(v),
    }
}

pub fn f(key: &'static str, v: f64) -> KeyValue {
    KeyValue {
        key,
        value: Value::Double(v),
    }
}

/// The OTLP span kinds used here (the proto's enum values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpanKind {
    #[default]
    Unspecified = 0,
    Internal = 1,
    Server = 2,
    Client = 3,
}

/// The OTLP status codes (the proto's enum values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StatusCode {
    #[default]
    Unset = 0,
    Error = 2,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Status {
    pub code: StatusCode,
    pub message: String,
}

/// Ids are fixed-size values, not allocations: a span is built and
/// encoded many thousand times a second.
pub type TraceId = [u8; 16];
pub type SpanId = [u8; 8];

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Link {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub attributes: Vec<KeyValue>,
}

/// A span as a value: what tests collect from the builders.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Span {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// None for a trace's root.
    pub parent_span_id: Option<SpanId>,
    pub name: String,
    pub kind: SpanKind,
    pub start_time_unix_nano: u64,
    pub end_time_unix_nano: u64,
    pub attributes: Vec<KeyValue>,
    pub links: Vec<Link>,
    pub status: Option<Status>,
    pub trace_state: String,
}

/// A span's fixed fields, given when it begins.
pub struct Head<'a> {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// None for a trace's root.
    pub parent_span_id: Option<SpanId>,
    pub name: fmt::Arguments<'a>,
    pub kind: SpanKind,
    pub start_time_unix_nano: u64,
    pub end_time_unix_nano: u64,
}

/// An attribute's value, borrowed or formatted in place.
#[derive(Clone, Copy)]
pub enum Attr<'a> {
    Str(&'a str),
    Host(Host<'a>),
    Fmt(fmt::Arguments<'a>),
    Int(i64),
    Double(f64),
}

/// Where the span builders write.
pub trait SpanOut {
    type Body<'s>: SpanBody
    where
        Self: 's;

    /// A new span; its attributes, links and status follow, in that order
    /// (the proto's field order), through the returned body.
    fn span(&mut self, head: Head<'_>) -> Self::Body<'_>;
}

/// The rest of a span.
pub trait SpanBody {
    fn attr(&mut self, key: &'static str, value: Attr<'_>);
    /// A link with one attribute (all the links spans here carry).
    fn link(&mut self, trace_id: TraceId, span_id: SpanId, key: &'static str, value: &str);
    fn status(&mut self, code: StatusCode, message: &str);
    /// The W3C `tracestate` the span carries on (written out of the
    /// proto's field order, which decoders accept).
    fn trace_state(&mut self, v: &str);

    fn str(&mut self, key: &'static str, v: &str) {
        self.attr(key, Attr::Str(v));
    }

    fn int(&mut self, key: &'static str, v: i64) {
        self.attr(key, Attr::Int(v));
    }

    fn double(&mut self, key: &'static str, v: f64) {
        self.attr(key, Attr::Double(v));
    }
}

impl SpanOut for Vec<Span> {
    type Body<'s> = &'s mut Span;

    fn span(&mut self, h: Head<'_>) -> &mut Span {
        self.push(Span {
            trace_id: h.trace_id,
            span_id: h.span_id,
            parent_span_id: h.parent_span_id,
            name: h.name.to_string(),
            kind: h.kind,
            start_time_unix_nano: h.start_time_unix_nano,
            end_time_unix_nano: h.end_time_unix_nano,
            ..Span::default()
        });
        let at = self.len() - 1;
        &mut self[at]
    }
}

impl SpanBody for &mut Span {
    fn attr(&mut self, key: &'static str, value: Attr<'_>) {
        let value = match value {
            Attr::Str(v) => Value::Str(v.to_owned().into()),
            Attr::Host(v) => Value::Str(v.to_string().into()),
            Attr::Fmt(v) => Value::Str(v.to_string().into()),
            Attr::Int(v) => Value::Int(v),
            Attr::Double(v) => Value::Double(v),
        };
        self.attributes.push(KeyValue { key, value });
    }

    fn link(&mut self, trace_id: TraceId, span_id: SpanId, key: &'static str, value: &str) {
        self.links.push(Link {
            trace_id,
            span_id,
            attributes: vec![s(key, value.to_owned())],
        });
    }

    fn status(&mut self, code: StatusCode, message: &str) {
        self.status = Some(Status {
            code,
            message: message.to_owned(),
        });
    }

    fn trace_state(&mut self, v: &str) {
        v.clone_into(&mut self.trace_state);
    }
}

/// One resource's spans, encoded (each a framed field 2 of ScopeSpans).
#[derive(Default)]
pub struct SpanList {
    buf: Vec<u8>,
    count: usize,
    /// Formatted text on its way into `buf` (its length goes first).
    scratch: String,
}

impl SpanList {
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn clear(&mut self) {
        self.buf.clear();
        self.count = 0;
    }
}

/// A span being written; its length is put in front when it is dropped.
pub struct SpanWriter<'a> {
    list: &'a mut SpanList,
    /// Where the span's length goes (`LEN_ROOM` bytes kept for it).
    len_at: usize,
}

/// Room kept for a span's length: most spans are 128 bytes to 16 KiB.
const LEN_ROOM: usize = 2;

impl SpanOut for SpanList {
    type Body<'s> = SpanWriter<'s>;

    fn span(&mut self, h: Head<'_>) -> SpanWriter<'_> {
        self.count += 1;
        put_key(&mut self.buf, 2, LEN);
        let len_at = self.buf.len();
        self.buf.extend_from_slice(&[0; LEN_ROOM]);
        let buf = &mut self.buf;
        put_bytes(buf, 1, &h.trace_id);
        put_bytes(buf, 2, &h.span_id);
        if let Some(p) = &h.parent_span_id {
            put_bytes(buf, 4, p);
        }
        match h.name.as_str() {
            Some(name) => put_bytes(buf, 5, name.as_bytes()),
            None => {
                self.scratch.clear();
                let _ = self.scratch.write_fmt(h.name);
                put_bytes(buf, 5, self.scratch.as_bytes());
            }
        }
        put_varint_field(buf, 6, h.kind as u64);
        put_fixed64(buf, 7, h.start_time_unix_nano);
        put_fixed64(buf, 8, h.end_time_unix_nano);
        SpanWriter { list: self, len_at }
    }
}

impl SpanBody for SpanWriter<'_> {
    fn attr(&mut self, key: &'static str, value: Attr<'_>) {
        let l = &mut *self.list;
        match value {
            Attr::Str(v) | Attr::Host(Host::Name(v)) => {
                put_attr(&mut l.buf, 9, key, AnyRef::Str(v))
            }
            Attr::Host(Host::Ip(a)) => {
                l.scratch.clear();
                push_ip(&mut l.scratch, a);
                put_attr(&mut l.buf, 9, key, AnyRef::Str(&l.scratch));
            }
            Attr::Fmt(v) => match v.as_str() {
                Some(v) => put_attr(&mut l.buf, 9, key, AnyRef::Str(v)),
                None => {
                    l.scratch.clear();
                    let _ = l.scratch.write_fmt(v);
                    put_attr(&mut l.buf, 9, key, AnyRef::Str(&l.scratch));
                }
            },
            Attr::Int(v) => put_attr(&mut l.buf, 9, key, AnyRef::Int(v)),
            Attr::Double(v) => put_attr(&mut l.buf, 9, key, AnyRef::Double(v)),
        }
    }

    fn link(&mut self, trace_id: TraceId, span_id: SpanId, key: &'static str, value: &str) {
        let buf = &mut self.list.buf;
        let body =
            bytes_len(1, &trace_id) + bytes_len(2, &span_id) + attr_len(4, key, AnyRef::Str(value));
        put_key(buf, 13, LEN);
        put_varint(buf, body as u64);
        put_bytes(buf, 1, &trace_id);
        put_bytes(buf, 2, &span_id);
        put_attr(buf, 4, key, AnyRef::Str(value));
    }

    fn status(&mut self, code: StatusCode, message: &str) {
        let buf = &mut self.list.buf;
        let body = bytes_len(2, message.as_bytes()) + varint_field_len(3, code as u64);
        put_key(buf, 15, LEN);
        put_varint(buf, body as u64);
        put_bytes(buf, 2, message.as_bytes());
        put_varint_field(buf, 3, code as u64);
    }

    fn trace_state(&mut self, v: &str) {
        put_bytes(&mut self.list.buf, 3, v.as_bytes());
    }
}

impl Drop for SpanWriter<'_> {
    fn drop(&mut self) {
        let buf = &mut self.list.buf;
        let body_at = self.len_at + LEN_ROOM;
        let n = buf.len() - body_at;
        let room = varint_len(n as u64);
        // Move the body when its length takes other than the room kept.
        if room < LEN_ROOM {
            buf.copy_within(body_at.., self.len_at + room);
            buf.truncate(buf.len() - (LEN_ROOM - room));
        } else if room > LEN_ROOM {
            buf.splice(body_at..body_at, std::iter::repeat_n(0, room - LEN_ROOM));
        }
        // The varint in place, in the room now exactly its size.
        let mut v = n as u64;
        for b in &mut buf[self.len_at..self.len_at + room] {
            *b = (v as u8 & 0x7f) | if v >= 0x80 { 0x80 } else { 0 };
            v >>= 7;
        }
    }
}

/// The spans of one export, one resource (process) each.
#[derive(Default)]
pub struct TraceBatch {
    resources: Vec<(Vec<KeyValue>, SpanList)>,
    by_pid: HashMap<Option<u32>, usize>,
    /// Lists of earlier batches, kept for their buffers.
    spare: Vec<SpanList>,
}

impl TraceBatch {
    /// The span list of `pid`'s resource, made with `resource` the first time.
    pub fn spans_of(
        &mut self,
        pid: Option<u32>,
        resource: impl FnOnce() -> Vec<KeyValue>,
    ) -> &mut SpanList {
        let at = match self.by_pid.get(&pid) {
            Some(&at) => at,
            None => {
                let list = self.spare.pop().unwrap_or_default();
                self.resources.push((resource(), list));
                self.by_pid.insert(pid, self.resources.len() - 1);
                self.resources.len() - 1
            }
        };
        &mut self.resources[at].1
    }

    pub fn span_count(&self) -> usize {
        self.resources.iter().map(|(_, l)| l.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }

    /// The ExportTraceServiceRequest's bytes; the batch is empty after.
    pub fn encode(&mut self) -> Vec<u8> {
        let scope = scope_len();
        let lens: Vec<(usize, usize, usize)> = self
            .resources
            .iter()
            .map(|(attrs, spans)| {
                let res: usize = attrs.iter().map(|a| kv_len(1, a)).sum();
                let scope_spans = framed_len(1, scope) + spans.buf.len();
                (
                    res,
                    scope_spans,
                    framed_len(1, res) + framed_len(2, scope_spans),
                )
            })
            .collect();
        let total: usize = lens.iter().map(|&(_, _, rs)| framed_len(1, rs)).sum();
        let mut buf = Vec::with_capacity(total);
        for ((attrs, spans), (res, scope_spans, rs)) in self.resources.iter().zip(lens) {
            put_key(&mut buf, 1, LEN);
            put_varint(&mut buf, rs as u64);
            put_key(&mut buf, 1, LEN);
            put_varint(&mut buf, res as u64);
            for a in attrs {
                put_kv(&mut buf, 1, a);
            }
            put_key(&mut buf, 2, LEN);
            put_varint(&mut buf, scope_spans as u64);
            put_key(&mut buf, 1, LEN);
            put_varint(&mut buf, scope as u64);
            put_bytes(&mut buf, 1, SCOPE_NAME.as_bytes());
            put_bytes(&mut buf, 2, SCOPE_VERSION.as_bytes());
            buf.extend_from_slice(&spans.buf);
        }
        debug_assert_eq!(buf.len(), total);
        self.by_pid.clear();
        for (_, mut list) in self.resources.drain(..) {
            list.clear();
            self.spare.push(list);
        }
        buf
    }
}

pub const SCOPE_NAME: &str = "observer";
pub const SCOPE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// InstrumentationScope's body: the observer's name and version.
fn scope_len() -> usize {
    bytes_len(1, SCOPE_NAME.as_bytes()) + bytes_len(2, SCOPE_VERSION.as_bytes())
}

fn any(v: &Value) -> AnyRef<'_> {
    match v {
        Value::Str(v) => AnyRef::Str(v),
        Value::Int(v) => AnyRef::Int(*v),
        Value::Double(v) => AnyRef::Double(*v),
        Value::Bool(v) => AnyRef::Bool(*v),
    }
}

fn kv_len(field: u32, a: &KeyValue) -> usize {
    attr_len(field, a.key, any(&a.value))
}

fn put_kv(buf: &mut Vec<u8>, field: u32, a: &KeyValue) {
    put_attr(buf, field, a.key, any(&a.value));
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::{
        collector::trace::v1::ExportTraceServiceRequest,
        common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue as PKeyValue},
        resource::v1::Resource as PResource,
        trace::v1::{
            span::Link as PLink, ResourceSpans as PResourceSpans, ScopeSpans as PScopeSpans,
            Span as PSpan, Status as PStatus,
        },
    };
    use prost::Message as _;

    use super::*;

    fn kv(a: &KeyValue) -> PKeyValue {
        let value = match &a.value {
            Value::Str(v) => any_value::Value::StringValue(v.to_string()),
            Value::Int(v) => any_value::Value::IntValue(*v),
            Value::Double(v) => any_value::Value::DoubleValue(*v),
            Value::Bool(v) => any_value::Value::BoolValue(*v),
        };
        PKeyValue {
            key: a.key.to_owned(),
            value: Some(AnyValue { value: Some(value) }),
            ..PKeyValue::default()
        }
    }

    fn generated_span(s: &Span) -> PSpan {
        PSpan {
            trace_id: s.trace_id.to_vec(),
            span_id: s.span_id.to_vec(),
            parent_span_id: s.parent_span_id.map_or_else(Vec::new, |p| p.to_vec()),
            name: s.name.clone(),
            kind: s.kind as i32,
            start_time_unix_nano: s.start_time_unix_nano,
            end_time_unix_nano: s.end_time_unix_nano,
            attributes: s.attributes.iter().map(kv).collect(),
            links: s
                .links
                .iter()
                .map(|l| PLink {
                    trace_id: l.trace_id.to_vec(),
                    span_id: l.span_id.to_vec(),
                    attributes: l.attributes.iter().map(kv).collect(),
                    ..PLink::default()
                })
                .collect(),
            status: s.status.as_ref().map(|st| PStatus {
                code: st.code as i32,
                message: st.message.clone(),
            }),
            trace_state: s.trace_state.clone(),
            ..PSpan::default()
        }
    }

    /// The same request in opentelemetry-proto's generated types.
    fn generated(resources: &[(Vec<KeyValue>, Vec<Span>)]) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: resources
                .iter()
                .map(|(attrs, spans)| PResourceSpans {
                    resource: Some(PResource {
                        attributes: attrs.iter().map(kv).collect(),
                        ..PResource::default()
                    }),
                    scope_spans: vec![PScopeSpans {
                        scope: Some(InstrumentationScope {
                            name: SCOPE_NAME.into(),
                            version: SCOPE_VERSION.into(),
                            ..InstrumentationScope::default()
                        }),
                        spans: spans.iter().map(generated_span).collect(),
                        schema_url: String::new(),
                    }],
                    schema_url: String::new(),
                })
                .collect(),
        }
    }

    /// One span with every kind of field, written through `out`.
    fn write_span(out: &mut impl SpanOut, n: u8, parent: Option<SpanId>, long: usize) {
        let host = std::net::IpAddr::from([10, 0, 0, n]);
        let mut b = out.span(Head {
            trace_id: [n; 16],
            span_id: [n + 1; 8],
            parent_span_id: parent,
            name: format_args!("span {n} é"),
            kind: if parent.is_some() {
                SpanKind::Internal
            } else {
                SpanKind::Client
            },
            start_time_unix_nano: if parent.is_some() {
                0
            } else {
                1_700_000_000_000_000_000
            },
            end_time_unix_nano: 1_700_000_000_123_456_789,
        });
        b.str("server.address", "example.test");
        b.attr("network.peer.address", Attr::Host(Host::Ip(&host)));
        b.attr("client.address", Attr::Host(Host::Name("client.test")));
        b.attr(
            "url.path",
            Attr::Fmt(format_args!("/v1/{}", "x".repeat(long))),
        );
        b.attr("static", Attr::Fmt(format_args!("fixed")));
        b.str("empty", "");
        b.int("server.port", 443);
        b.int("negative", -7);
        b.int("zero", 0);
        b.double("observer.ttfb", 0.25);
        b.double("zero.f", 0.0);
        if parent.is_none() {
            b.link(
                [9; 16],
                [8; 8],
                "observer.link",
                "connection's first request",
            );
            b.status(StatusCode::Error, "reset");
        } else {
            b.status(StatusCode::Unset, "");
        }
    }

    #[test]
    fn a_varints_length_is_what_is_written() {
        for shift in 0..64 {
            for v in [(1u64 << shift) - 1, 1u64 << shift, (1u64 << shift) + 1] {
                let mut b = Vec::new();
                put_varint(&mut b, v);
                assert_eq!(varint_len(v), b.len(), "{v}");
            }
        }
        assert_eq!(varint_len(u64::MAX), 10);
    }

    #[test]
    fn the_encoding_decodes_to_the_spans_the_builders_gave() {
        let resources = [
            (
                vec![s("service.name", "curl"), i("process.pid", 42)],
                Some(42),
            ),
            (vec![s("service.name", "nginx")], None),
        ];
        let mut batch = TraceBatch::default();
        let mut expected = Vec::new();
        // Bodies under 128 bytes, up to 16 KiB, and over: the length kept
        // room for two bytes, so all three move the body.
        for (k, (attrs, pid)) in resources.iter().enumerate() {
            let mut values = Vec::new();
            for (j, long) in [0usize, 3000, 20_000].into_iter().enumerate() {
                let n = (k * 10 + j) as u8;
                let list = batch.spans_of(*pid, || attrs.clone());
                write_span(list, n, None, long);
                write_span(list, n + 100, Some([n; 8]), long);
                write_span(&mut values, n, None, long);
                write_span(&mut values, n + 100, Some([n; 8]), long);
            }
            let short = batch.spans_of(*pid, Vec::new);
            short.span(Head {
                trace_id: [1; 16],
                span_id: [2; 8],
                parent_span_id: Some([3; 8]),
                name: format_args!("wait first byte"),
                kind: SpanKind::Internal,
                start_time_unix_nano: 5,
                end_time_unix_nano: 6,
            });
            values.push(Span {
                trace_id: [1; 16],
                span_id: [2; 8],
                parent_span_id: Some([3; 8]),
                name: "wait first byte".into(),
                kind: SpanKind::Internal,
                start_time_unix_nano: 5,
                end_time_unix_nano: 6,
                ..Span::default()
            });
            expected.push((attrs.clone(), values));
        }
        assert_eq!(batch.span_count(), 14);
        let ours = batch.encode();
        let want = generated(&expected);
        assert_eq!(
            ours,
            want.encode_to_vec(),
            "prost's bytes for the same spans"
        );
        let back = ExportTraceServiceRequest::decode(ours.as_slice()).expect("decodes");
        assert_eq!(back, want);
        assert_eq!(
            back.resource_spans[0].scope_spans[0].spans[0].name,
            "span 0 é"
        );
        // The batch is empty after, its buffers kept for the next.
        assert!(batch.is_empty());
        assert_eq!(batch.encode(), Vec::<u8>::new());
        let list = batch.spans_of(Some(1), Vec::new);
        write_span(list, 1, None, 0);
        let mut one = Vec::new();
        write_span(&mut one, 1, None, 0);
        assert_eq!(
            batch.encode(),
            generated(&[(Vec::new(), one)]).encode_to_vec()
        );
    }

    #[test]
    fn varint_lengths() {
        for v in [
            0u64,
            1,
            127,
            128,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            assert_eq!(b.len(), varint_len(v), "{v}");
        }
    }
}
