//! Spans as the exporter builds them, and their OTLP protobuf encoding
//! (opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest),
//! written by hand: attribute keys are the conventions' static names and
//! fixed values stay static, where opentelemetry-proto's generated types
//! want an owned String for each. Building, encoding and freeing those
//! types was most of the daemon's CPU under connection churn
//! (bench/NOTES.md). A unit test checks the bytes against prost's encoding
//! of the same spans in the generated types.

use std::borrow::Cow;

/// Text that is often a fixed name.
pub type Text = Cow<'static, str>;

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
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Resource {
    pub attributes: Vec<KeyValue>,
}

/// One instrumentation scope's spans (always the observer's scope).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScopeSpans {
    pub spans: Vec<Span>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResourceSpans {
    pub resource: Option<Resource>,
    pub scope_spans: Vec<ScopeSpans>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct TraceRequest {
    pub resource_spans: Vec<ResourceSpans>,
}

pub const SCOPE_NAME: &str = "observer";
pub const SCOPE_VERSION: &str = env!("CARGO_PKG_VERSION");

impl TraceRequest {
    /// The ExportTraceServiceRequest's bytes. Each span's size is worked out
    /// once (a nested message's size precedes it, so a plain recursive
    /// writer would size every span once per level above it).
    pub fn encode(&self) -> Vec<u8> {
        let span_lens: Vec<usize> = self
            .resource_spans
            .iter()
            .flat_map(|rs| &rs.scope_spans)
            .flat_map(|ss| &ss.spans)
            .map(Message::body_len)
            .collect();
        let framed = |n: usize| key_len(2) + varint_len(n as u64) + n;
        // Sizes of each scope's and each resource's body, from the spans'.
        let mut at = 0;
        let mut scope_lens = Vec::new();
        let mut resource_lens = Vec::new();
        for rs in &self.resource_spans {
            let mut rlen = rs.resource.as_ref().map_or(0, |r| message_len(1, r));
            for ss in &rs.scope_spans {
                let n = ss.spans.len();
                let slen = message_len(1, &Scope)
                    + span_lens[at..at + n]
                        .iter()
                        .map(|&l| framed(l))
                        .sum::<usize>();
                at += n;
                scope_lens.push(slen);
                rlen += framed(slen);
            }
            resource_lens.push(rlen);
        }
        let total: usize = resource_lens
            .iter()
            .map(|&l| key_len(1) + varint_len(l as u64) + l)
            .sum();
        let mut buf = Vec::with_capacity(total);
        let (mut span_i, mut scope_i) = (0, 0);
        for (rs, rlen) in self.resource_spans.iter().zip(resource_lens) {
            put_key(&mut buf, 1, LEN);
            put_varint(&mut buf, rlen as u64);
            if let Some(r) = &rs.resource {
                put_message(&mut buf, 1, r);
            }
            for ss in &rs.scope_spans {
                put_key(&mut buf, 2, LEN);
                put_varint(&mut buf, scope_lens[scope_i] as u64);
                scope_i += 1;
                put_message(&mut buf, 1, &Scope);
                for span in &ss.spans {
                    put_key(&mut buf, 2, LEN);
                    put_varint(&mut buf, span_lens[span_i] as u64);
                    span_i += 1;
                    span.write_body(&mut buf);
                }
            }
        }
        debug_assert_eq!(buf.len(), total);
        buf
    }
}

// Protobuf wire format: a key is (field << 3) | wire type; the fields of a
// message go in field order, defaults (0, empty) left out as prost does.

const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn key_len(field: u32) -> usize {
    varint_len(u64::from(field << 3))
}

fn put_key(buf: &mut Vec<u8>, field: u32, wire: u32) {
    put_varint(buf, u64::from((field << 3) | wire));
}

fn bytes_len(field: u32, b: &[u8]) -> usize {
    if b.is_empty() {
        0
    } else {
        key_len(field) + varint_len(b.len() as u64) + b.len()
    }
}

fn put_bytes(buf: &mut Vec<u8>, field: u32, b: &[u8]) {
    if !b.is_empty() {
        put_key(buf, field, LEN);
        put_varint(buf, b.len() as u64);
        buf.extend_from_slice(b);
    }
}

fn varint_field_len(field: u32, v: u64) -> usize {
    if v == 0 {
        0
    } else {
        key_len(field) + varint_len(v)
    }
}

fn put_varint_field(buf: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        put_key(buf, field, VARINT);
        put_varint(buf, v);
    }
}

fn fixed64_len(field: u32, v: u64) -> usize {
    if v == 0 {
        0
    } else {
        key_len(field) + 8
    }
}

fn put_fixed64(buf: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        put_key(buf, field, FIXED64);
        buf.extend_from_slice(&v.to_le_bytes());
    }
}

/// A message's own fields, and its size.
trait Message {
    fn body_len(&self) -> usize;
    fn write_body(&self, buf: &mut Vec<u8>);
}

fn message_len(field: u32, m: &impl Message) -> usize {
    let n = m.body_len();
    key_len(field) + varint_len(n as u64) + n
}

fn put_message(buf: &mut Vec<u8>, field: u32, m: &impl Message) {
    put_key(buf, field, LEN);
    put_varint(buf, m.body_len() as u64);
    m.write_body(buf);
}

fn messages_len<M: Message>(field: u32, ms: &[M]) -> usize {
    ms.iter().map(|m| message_len(field, m)).sum()
}

fn put_messages<M: Message>(buf: &mut Vec<u8>, field: u32, ms: &[M]) {
    for m in ms {
        put_message(buf, field, m);
    }
}

/// AnyValue: a oneof, written even when it holds a default.
struct Any<'a>(&'a Value);

impl Message for Any<'_> {
    fn body_len(&self) -> usize {
        match self.0 {
            Value::Str(v) => key_len(1) + varint_len(v.len() as u64) + v.len(),
            Value::Bool(_) => key_len(2) + 1,
            Value::Int(v) => key_len(3) + varint_len(*v as u64),
            Value::Double(_) => key_len(4) + 8,
        }
    }

    fn write_body(&self, buf: &mut Vec<u8>) {
        match self.0 {
            Value::Str(v) => {
                put_key(buf, 1, LEN);
                put_varint(buf, v.len() as u64);
                buf.extend_from_slice(v.as_bytes());
            }
            Value::Bool(v) => {
                put_key(buf, 2, VARINT);
                buf.push(u8::from(*v));
            }
            Value::Int(v) => {
                put_key(buf, 3, VARINT);
                put_varint(buf, *v as u64);
            }
            Value::Double(v) => {
                put_key(buf, 4, FIXED64);
                buf.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
}

impl Message for KeyValue {
    fn body_len(&self) -> usize {
        bytes_len(1, self.key.as_bytes()) + message_len(2, &Any(&self.value))
    }

    fn write_body(&self, buf: &mut Vec<u8>) {
        put_bytes(buf, 1, self.key.as_bytes());
        put_message(buf, 2, &Any(&self.value));
    }
}

impl Message for Status {
    fn body_len(&self) -> usize {
        bytes_len(2, self.message.as_bytes()) + varint_field_len(3, self.code as u64)
    }

    fn write_body(&self, buf: &mut Vec<u8>) {
        put_bytes(buf, 2, self.message.as_bytes());
        put_varint_field(buf, 3, self.code as u64);
    }
}

impl Message for Link {
    fn body_len(&self) -> usize {
        bytes_len(1, &self.trace_id)
            + bytes_len(2, &self.span_id)
            + messages_len(4, &self.attributes)
    }

    fn write_body(&self, buf: &mut Vec<u8>) {
        put_bytes(buf, 1, &self.trace_id);
        put_bytes(buf, 2, &self.span_id);
        put_messages(buf, 4, &self.attributes);
    }
}

impl Message for Span {
    fn body_len(&self) -> usize {
        bytes_len(1, &self.trace_id)
            + bytes_len(2, &self.span_id)
            + self.parent_span_id.as_ref().map_or(0, |p| bytes_len(4, p))
            + bytes_len(5, self.name.as_bytes())
            + varint_field_len(6, self.kind as u64)
            + fixed64_len(7, self.start_time_unix_nano)
            + fixed64_len(8, self.end_time_unix_nano)
            + messages_len(9, &self.attributes)
            + messages_len(13, &self.links)
            + self.status.as_ref().map_or(0, |s| message_len(15, s))
    }

    fn write_body(&self, buf: &mut Vec<u8>) {
        put_bytes(buf, 1, &self.trace_id);
        put_bytes(buf, 2, &self.span_id);
        if let Some(p) = &self.parent_span_id {
            put_bytes(buf, 4, p);
        }
        put_bytes(buf, 5, self.name.as_bytes());
        put_varint_field(buf, 6, self.kind as u64);
        put_fixed64(buf, 7, self.start_time_unix_nano);
        put_fixed64(buf, 8, self.end_time_unix_nano);
        put_messages(buf, 9, &self.attributes);
        put_messages(buf, 13, &self.links);
        if let Some(s) = &self.status {
            put_message(buf, 15, s);
        }
    }
}

impl Message for Resource {
    fn body_len(&self) -> usize {
        messages_len(1, &self.attributes)
    }

    fn write_body(&self, buf: &mut Vec<u8>) {
        put_messages(buf, 1, &self.attributes);
    }
}

/// InstrumentationScope: the observer's name and version.
struct Scope;

impl Message for Scope {
    fn body_len(&self) -> usize {
        bytes_len(1, SCOPE_NAME.as_bytes()) + bytes_len(2, SCOPE_VERSION.as_bytes())
    }

    fn write_body(&self, buf: &mut Vec<u8>) {
        put_bytes(buf, 1, SCOPE_NAME.as_bytes());
        put_bytes(buf, 2, SCOPE_VERSION.as_bytes());
    }
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

    /// The same request in opentelemetry-proto's generated types.
    fn generated(r: &TraceRequest) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: r
                .resource_spans
                .iter()
                .map(|rs| PResourceSpans {
                    resource: rs.resource.as_ref().map(|res| PResource {
                        attributes: res.attributes.iter().map(kv).collect(),
                        ..PResource::default()
                    }),
                    scope_spans: rs
                        .scope_spans
                        .iter()
                        .map(|ss| PScopeSpans {
                            scope: Some(InstrumentationScope {
                                name: SCOPE_NAME.into(),
                                version: SCOPE_VERSION.into(),
                                ..InstrumentationScope::default()
                            }),
                            spans: ss
                                .spans
                                .iter()
                                .map(|s| PSpan {
                                    trace_id: s.trace_id.to_vec(),
                                    span_id: s.span_id.to_vec(),
                                    parent_span_id: s
                                        .parent_span_id
                                        .map_or_else(Vec::new, |p| p.to_vec()),
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
                                    ..PSpan::default()
                                })
                                .collect(),
                            schema_url: String::new(),
                        })
                        .collect(),
                    schema_url: String::new(),
                })
                .collect(),
        }
    }

    #[test]
    fn the_bytes_are_prosts_for_the_same_spans() {
        let span = |n: u8, parent: Option<SpanId>| Span {
            trace_id: [n; 16],
            span_id: [n + 1; 8],
            parent_span_id: parent,
            name: format!("span {n} é"),
            kind: SpanKind::Client,
            start_time_unix_nano: 1_700_000_000_000_000_000,
            end_time_unix_nano: 1_700_000_000_123_456_789,
            attributes: vec![
                s("server.address", "example.test"),
                s("url.path", String::from("/v1/chat/completions")),
                s("empty", ""),
                i("server.port", 443),
                i("negative", -7),
                i("zero", 0),
                f("observer.ttfb", 0.25),
                f("zero.f", 0.0),
                KeyValue {
                    key: "flag",
                    value: Value::Bool(false),
                },
            ],
            links: vec![Link {
                trace_id: [9; 16],
                span_id: [8; 8],
                attributes: vec![s("observer.link", "connection's first request")],
            }],
            status: Some(Status {
                code: StatusCode::Error,
                message: "reset".into(),
            }),
        };
        let mut plain = span(3, Some([4; 8]));
        plain.links.clear();
        plain.status = Some(Status::default());
        plain.kind = SpanKind::Unspecified;
        plain.start_time_unix_nano = 0;
        let req = TraceRequest {
            resource_spans: vec![
                ResourceSpans {
                    resource: Some(Resource {
                        attributes: vec![s("service.name", "curl"), i("process.pid", 42)],
                    }),
                    scope_spans: vec![ScopeSpans {
                        spans: vec![span(1, None), plain],
                    }],
                },
                ResourceSpans {
                    resource: None,
                    scope_spans: vec![ScopeSpans { spans: Vec::new() }],
                },
            ],
        };
        let ours = req.encode();
        assert_eq!(ours, generated(&req).encode_to_vec());
        let back = ExportTraceServiceRequest::decode(ours.as_slice()).expect("decodes");
        assert_eq!(
            back.resource_spans[0].scope_spans[0].spans[0].name,
            "span 1 é"
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
