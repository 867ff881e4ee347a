//! OTLP attribute helpers and the semantic-convention names we emit.

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
    pub fn connection_trace_id(&self, conn_key: u64) -> Vec<u8> {
        let mut v = self.derived(conn_key, 1).to_be_bytes().to_vec();
        v.extend_from_slice(&self.derived(conn_key, 2).to_be_bytes());
        v
    }

    /// The root span of a connection's first request.
    pub fn connection_span_id(&self, conn_key: u64) -> Vec<u8> {
        self.derived(conn_key, 3).max(1).to_be_bytes().to_vec()
    }

    pub fn trace_id(&mut self) -> Vec<u8> {
        let mut v = self.next().to_be_bytes().to_vec();
        v.extend_from_slice(&self.next().to_be_bytes());
        v
    }

    pub fn span_id(&mut self) -> Vec<u8> {
        // Never all zero (an invalid span id).
        self.next().max(1).to_be_bytes().to_vec()
    }
}

impl Default for Ids {
    fn default() -> Self {
        Self::new()
    }
}
