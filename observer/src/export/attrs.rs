//! OTLP attribute helpers and the semantic-convention names we emit.

use super::span_wire::{SpanId, TraceId};
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};

pub fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..KeyValue::default()
    }
}

pub fn s(key: &str, v: impl Into<String>) -> KeyValue {
    kv(key, Value::StringValue(v.into()))
}

pub fn i(key: &str, v: i64) -> KeyValue {
    kv(key, Value::IntValue(v))
}

pub fn f(key: &str, v: f64) -> KeyValue {
    kv(key, Value::DoubleValue(v))
}

/// `error.type` values for the record's error words.
pub fn error_type(error: &str) -> &'static str {
    match error {
        "refused" => "connection_refused",
        "timeout" => "timed_out",
        "unreachable" => "host_unreachable",
        "reset" => "connection_reset",
        "aborted" => "connection_aborted",
        _ => "_OTHER",
    }
}

/// Fresh random trace and span ids (SplitMix64 seeded from the std hasher's
/// per-process random keys and the clock: unique enough for ids, no crate),
/// and ids derived from a connection's key, the same for every record of
/// that connection within one exporter.
pub struct Ids {
    state: u64,
    /// Random per exporter: derived ids differ between runs and hosts.
    salt: u64,
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Ids {
    pub fn new() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        let seed = h.finish();
        Self {
            state: seed,
            salt: mix(seed ^ 0x5DEE_CE66_D1CE_4E5B),
        }
    }

    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.state)
    }

    fn derived(&self, key: u64, n: u64) -> u64 {
        mix(mix(self.salt ^ key).wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
    }

    /// The trace of a connection's first request (see `request_spans`).
    pub fn connection_trace_id(&self, conn_key: u64) -> TraceId {
        pair(self.derived(conn_key, 1), self.derived(conn_key, 2))
    }

    /// The root span of a connection's first request.
    pub fn connection_span_id(&self, conn_key: u64) -> SpanId {
        self.derived(conn_key, 3).max(1).to_be_bytes()
    }

    /// The sampling draw of a connection's record and of its first
    /// request's: one trace holds the connection's phases, the other links
    /// to it, so both are kept or both left out.
    pub fn connection_draw(&self, conn_key: u64) -> u64 {
        self.derived(conn_key, 4)
    }

    pub fn trace_id(&mut self) -> TraceId {
        let hi = self.next();
        pair(hi, self.next())
    }

    pub fn span_id(&mut self) -> SpanId {
        // Never all zero (an invalid span id).
        self.next().max(1).to_be_bytes()
    }

    /// A draw for sampling.
    pub fn draw(&mut self) -> u64 {
        self.next()
    }
}

fn pair(hi: u64, lo: u64) -> TraceId {
    let mut id = [0; 16];
    id[..8].copy_from_slice(&hi.to_be_bytes());
    id[8..].copy_from_slice(&lo.to_be_bytes());
    id
}

impl Default for Ids {
    fn default() -> Self {
        Self::new()
    }
}
