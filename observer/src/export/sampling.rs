//! Which records become traces (`Sampling`, and what a record tells it
//! through `Sampled`): shared by the exporter and the queue in front of it,
//! so that neither imports the other.

use std::time::Duration;

use super::spans::Traced;
use crate::record::ConnRecord;

/// Which records become traces. Metrics see every record.
#[derive(Clone, Copy, Debug)]
pub struct Sampling {
    /// Share of ordinary records exported (0..=1).
    pub ratio: f64,
    /// Records at least this long are always exported.
    pub slow: Duration,
    /// A record whose request carried a `traceparent` follows its sampled
    /// flag (a `parentbased_` sampler) rather than the ratio.
    pub parent_based: bool,
}

/// The draw key of a record placed in a trace: its trace id's low half (as
/// the SDKs' TraceIdRatioBased reads it), so that every record of one trace
/// (a local call's client and server, a connection and its first request)
/// is kept or left out together.
fn trace_draw_key(trace_id: &[u8; 16]) -> u64 {
    let mut low = [0; 8];
    low.copy_from_slice(&trace_id[8..]);
    u64::from_be_bytes(low)
}

/// What sampling reads of a record.
pub trait Sampled {
    /// Failed records are always kept.
    fn failed(&self) -> bool;
    fn duration_ns(&self) -> u64;
    /// A key whose draw the record shares with others (its trace's
    /// records; a connection's record and its first request's), or `None`
    /// for a draw of its own.
    fn shared_draw_key(&self) -> Option<u64>;
    /// The sampled flag of the trace context the record's request carried.
    fn parent_sampled(&self) -> Option<bool> {
        None
    }
}

impl Sampled for ConnRecord {
    fn failed(&self) -> bool {
        self.error.is_some()
            || self
                .tls
                .as_ref()
                .is_some_and(|t| t.handshake_error.is_some())
    }
    fn duration_ns(&self) -> u64 {
        self.duration_ns.unwrap_or(0)
    }
    fn shared_draw_key(&self) -> Option<u64> {
        match self.first_request? {
            crate::record::FirstRequest {
                trace: Some((t, _)),
                ..
            } => Some(trace_draw_key(&t)),
            _ => Some(self.conn_key),
        }
    }
}

impl Sampled for crate::http::RequestRecord {
    fn failed(&self) -> bool {
        self.error.is_some() || self.status.is_some_and(|s| s >= 500)
    }
    fn duration_ns(&self) -> u64 {
        self.duration_ns
    }
    fn parent_sampled(&self) -> Option<bool> {
        self.trace.incoming.map(|t| t.sampled)
    }
    fn shared_draw_key(&self) -> Option<u64> {
        match self.trace.trace_id {
            Some(t) => Some(trace_draw_key(&t.0)),
            None => self.connection.is_some().then_some(self.conn_key),
        }
    }
}

impl Sampled for crate::dns::DnsRecord {
    fn failed(&self) -> bool {
        self.result != "ok"
    }
    fn duration_ns(&self) -> u64 {
        self.duration_ns
    }
    fn shared_draw_key(&self) -> Option<u64> {
        None
    }
}

impl Sampled for Traced {
    fn failed(&self) -> bool {
        match self {
            Traced::Conn(r) => r.failed(),
            Traced::Dns(r) => r.failed(),
            Traced::Request(r) => r.failed(),
        }
    }
    fn duration_ns(&self) -> u64 {
        match self {
            Traced::Conn(r) => Sampled::duration_ns(r.as_ref()),
            Traced::Dns(r) => r.duration_ns,
            Traced::Request(r) => r.duration_ns,
        }
    }
    fn shared_draw_key(&self) -> Option<u64> {
        match self {
            Traced::Conn(r) => r.shared_draw_key(),
            Traced::Dns(r) => r.shared_draw_key(),
            Traced::Request(r) => r.shared_draw_key(),
        }
    }
    fn parent_sampled(&self) -> Option<bool> {
        match self {
            Traced::Request(r) => r.parent_sampled(),
            _ => None,
        }
    }
}

impl Sampling {
    pub fn keep(&self, r: &(impl Sampled + ?Sized), draw: u64) -> bool {
        let slow = r.duration_ns() >= self.slow.as_nanos() as u64;
        let chosen = match r.parent_sampled() {
            Some(sampled) if self.parent_based => sampled,
            _ => (draw as f64 / u64::MAX as f64) < self.ratio,
        };
        r.failed() || slow || chosen
    }
}
