//! Trace context: the W3C `traceparent` a request carries, and the ids our
//! records of a request take so that they join the application's trace and
//! each other.
//!
//! Both ends of a connection on this host make a record of the same
//! request; the server's must be the child of the client's. Records are
//! finished at different times (the server's usually first), so the ids
//! are not matched afterwards but derived: both ends of a connection share a
//! random nonce (see [`Pairs`]) and a request's ids are a function of that
//! nonce and the request's place on the connection (HTTP/1.x: its index;
//! HTTP/2: its stream id), the same whichever end computes them.

use std::{collections::HashMap, fmt, net::IpAddr};

use serde::{Serialize, Serializer};

pub type TraceId = [u8; 16];
pub type SpanId = [u8; 8];

/// A `traceparent` header's fields (version 00, or a later version read as
/// 00 is, as the W3C recommendation asks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: TraceId,
    /// The caller's span.
    pub parent_id: SpanId,
    pub sampled: bool,
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// Lowercase hex into `out` (uppercase is invalid in a traceparent).
fn unhex(s: &[u8], out: &mut [u8]) -> Option<()> {
    if s.len() != out.len() * 2 {
        return None;
    }
    for (o, pair) in out.iter_mut().zip(s.chunks_exact(2)) {
        *o = hex_digit(pair[0])? << 4 | hex_digit(pair[1])?;
    }
    Some(())
}

impl TraceParent {
    /// A `traceparent` value; None when it is not a valid one (all-zero
    /// ids, version ff, wrong lengths or characters).
    pub fn parse(v: &[u8]) -> Option<Self> {
        let v = v.trim_ascii();
        let mut parts = v.split(|&c| c == b'-');
        let mut version = [0u8; 1];
        unhex(parts.next()?, &mut version)?;
        let mut trace_id = [0; 16];
        unhex(parts.next()?, &mut trace_id)?;
        let mut parent_id = [0; 8];
        unhex(parts.next()?, &mut parent_id)?;
        let mut flags = [0u8; 1];
        unhex(parts.next()?, &mut flags)?;
        // Version 00 has exactly four fields; a later one may add more.
        let more = parts.next().is_some();
        let valid = version[0] != 0xff
            && !(version[0] == 0 && more)
            && trace_id != [0; 16]
            && parent_id != [0; 8];
        valid.then_some(Self {
            trace_id,
            parent_id,
            sampled: flags[0] & 1 != 0,
        })
    }
}

/// A `tracestate` value kept (at most 512 characters, the W3C's limit on
/// what a vendor must pass on; longer ones are not kept).
pub fn tracestate(v: &[u8]) -> Option<String> {
    let v = v.trim_ascii();
    (!v.is_empty() && v.len() <= 512)
        .then(|| std::str::from_utf8(v).ok().map(str::to_owned))
        .flatten()
}

/// An id written as lowercase hex in the JSON records (as OTLP/JSON and
/// `traceparent` write them).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Hex<const N: usize>(pub [u8; N]);

impl<const N: usize> fmt::Display for Hex<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl<const N: usize> fmt::Debug for Hex<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl<const N: usize> Serialize for Hex<N> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// In the records' JSON Schema: the lowercase hex string `Serialize` writes.
impl<const N: usize> schemars::JsonSchema for Hex<N> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        format!("Hex{N}").into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": format!("^[0-9a-f]{{{}}}$", 2 * N),
        })
    }
}

/// A request record's place in a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanIds {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub parent_span_id: Option<SpanId>,
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One end of a connection: address and port.
pub type End = (IpAddr, u16);

/// The ends of a connection in a fixed order, whichever end sees it.
fn ordered(local: End, remote: End) -> ((End, End), usize) {
    if local <= remote {
        ((local, remote), 0)
    } else {
        ((remote, local), 1)
    }
}

/// A connection both of whose ends may be on this host.
struct Pair {
    nonce: u64,
    /// The socket of each end seen here, in [`ordered`]'s order.
    sockets: [Option<u64>; 2],
}

/// The nonces connections' ends share, by their addresses, and the source
/// of fresh ones (random per run: ids differ between runs and hosts).
pub struct Pairs {
    by_ends: HashMap<(End, End), Pair>,
    state: u64,
}

impl Default for Pairs {
    fn default() -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        Self {
            by_ends: HashMap::new(),
            state: h.finish(),
        }
    }
}

/// What one end of a connection knows of the trace ids it shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shared {
    nonce: u64,
}

impl Pairs {
    pub fn fresh(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.state).max(1)
    }

    /// The nonce of the connection between `local` and `remote` for the end
    /// on socket `sk`, its first bytes just seen: the other end's when that
    /// end is on this host and `live(its socket, its nonce)` says it is
    /// still the same connection, else a fresh one.
    pub fn join(
        &mut self,
        sk: u64,
        local: End,
        remote: End,
        live: impl Fn(u64, u64) -> bool,
    ) -> Shared {
        let (key, me) = ordered(local, remote);
        if let Some(p) = self.by_ends.get_mut(&key) {
            let other = p.sockets[1 - me];
            if p.sockets[me].is_none() && other.is_some_and(|o| live(o, p.nonce)) {
                p.sockets[me] = Some(sk);
                return Shared { nonce: p.nonce };
            }
        }
        let nonce = self.fresh();
        let mut sockets = [None; 2];
        sockets[me] = Some(sk);
        self.by_ends.insert(key, Pair { nonce, sockets });
        Shared { nonce }
    }

    /// Whether both ends of the connection `shared` names were seen here.
    pub fn both_here(&self, shared: Shared, local: End, remote: End) -> bool {
        let (key, _) = ordered(local, remote);
        self.by_ends
            .get(&key)
            .is_some_and(|p| p.nonce == shared.nonce && p.sockets.iter().all(Option::is_some))
    }

    /// The socket of the other end of the connection `shared` names, when
    /// it is on this host.
    pub fn other(&self, shared: Shared, local: End, remote: End) -> Option<u64> {
        let (key, me) = ordered(local, remote);
        let p = self.by_ends.get(&key).filter(|p| p.nonce == shared.nonce)?;
        p.sockets[1 - me]
    }

    /// Forgets connections neither of whose ends is `live` any more.
    pub fn retain(&mut self, live: impl Fn(u64, u64) -> bool) {
        self.by_ends
            .retain(|_, p| p.sockets.iter().flatten().any(|&sk| live(sk, p.nonce)));
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_ends.len()
    }
}

impl Shared {
    pub fn nonce(self) -> u64 {
        self.nonce
    }

    fn derived(self, place: u32, n: u64) -> u64 {
        mix(mix(self.nonce ^ u64::from(place) << 32)
            .wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
        .max(1)
    }

    /// The trace of request `place` when it carried no trace context.
    fn trace_id(self, place: u32) -> TraceId {
        let mut id = [0; 16];
        id[..8].copy_from_slice(&self.derived(place, 1).to_be_bytes());
        id[8..].copy_from_slice(&self.derived(place, 2).to_be_bytes());
        id
    }

    fn client_span(self, place: u32) -> SpanId {
        self.derived(place, 3).to_be_bytes()
    }

    fn server_span(self, place: u32) -> SpanId {
        self.derived(place, 4).to_be_bytes()
    }

    /// The ids of request `place` (HTTP/1.x: its index on the connection;
    /// HTTP/2: its stream id) seen from one end: the client's span is the
    /// child of the caller's (`incoming`), the server's the child of the
    /// client's when the client's end is on this host too (`both_here`),
    /// else of the caller the request names.
    pub fn request(
        self,
        place: u32,
        client: bool,
        both_here: bool,
        incoming: Option<&TraceParent>,
    ) -> SpanIds {
        let trace_id = incoming.map_or_else(|| self.trace_id(place), |t| t.trace_id);
        let caller = incoming.map(|t| t.parent_id);
        if client {
            SpanIds {
                trace_id,
                span_id: self.client_span(place),
                parent_span_id: caller,
            }
        } else {
            SpanIds {
                trace_id,
                span_id: self.server_span(place),
                parent_span_id: if both_here {
                    Some(self.client_span(place))
                } else {
                    caller
                },
            }
        }
    }
}

/// Ids of a request that cannot be placed on its connection (its index is
/// unknown): fresh, a trace of its own unless it carried one.
pub fn unplaced(pairs: &mut Pairs, incoming: Option<&TraceParent>) -> SpanIds {
    let mut trace_id = [0; 16];
    trace_id[..8].copy_from_slice(&pairs.fresh().to_be_bytes());
    trace_id[8..].copy_from_slice(&pairs.fresh().to_be_bytes());
    SpanIds {
        trace_id: incoming.map_or(trace_id, |t| t.trace_id),
        span_id: pairs.fresh().to_be_bytes(),
        parent_span_id: incoming.map(|t| t.parent_id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_is_read() {
        let t = TraceParent::parse(TP).expect("valid");
        assert_eq!(
            Hex(t.trace_id).to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(Hex(t.parent_id).to_string(), "00f067aa0ba902b7");
        assert!(t.sampled);
        let later = b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what";
        assert!(!TraceParent::parse(later).expect("a later version").sampled);
    }

    #[test]
    fn an_invalid_traceparent_is_none() {
        for bad in [
            &b"00-00000000000000000000000000000000-00f067aa0ba902b7-01"[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736",
            b"",
        ] {
            assert!(TraceParent::parse(bad).is_none(), "{bad:?}");
        }
    }

    fn end(port: u16) -> End {
        (IpAddr::from([127, 0, 0, 1]), port)
    }

    #[test]
    fn both_ends_on_this_host_share_ids_and_the_server_is_the_clients_child() {
        let mut pairs = Pairs::default();
        let client = pairs.join(1, end(40000), end(80), |_, _| false);
        let server = pairs.join(2, end(80), end(40000), |sk, _| sk == 1);
        assert_eq!(client, server);
        assert!(pairs.both_here(server, end(80), end(40000)));
        assert_eq!(pairs.other(server, end(80), end(40000)), Some(1));
        assert_eq!(pairs.other(client, end(40000), end(80)), Some(2));
        let tp = TraceParent::parse(TP);
        let c = client.request(1, true, true, tp.as_ref());
        let s = server.request(1, false, true, tp.as_ref());
        assert_eq!(c.trace_id, tp.expect("valid").trace_id);
        assert_eq!(c.parent_span_id, tp.map(|t| t.parent_id));
        assert_eq!(s.trace_id, c.trace_id);
        assert_eq!(s.parent_span_id, Some(c.span_id));
        // Without a trace context: one trace of our own, the same shape.
        let c2 = client.request(2, true, true, None);
        let s2 = server.request(2, false, true, None);
        assert_eq!(
            (s2.trace_id, s2.parent_span_id),
            (c2.trace_id, Some(c2.span_id))
        );
        assert_ne!(c2.trace_id, c.trace_id);
        assert_eq!(c2.parent_span_id, None);
    }

    #[test]
    fn a_server_whose_client_is_elsewhere_is_the_callers_child() {
        let mut pairs = Pairs::default();
        let server = pairs.join(2, end(80), end(40000), |_, _| false);
        assert!(!pairs.both_here(server, end(80), end(40000)));
        let tp = TraceParent::parse(TP);
        let s = server.request(1, false, false, tp.as_ref());
        assert_eq!(s.parent_span_id, tp.map(|t| t.parent_id));
        assert_eq!(server.request(1, false, false, None).parent_span_id, None);
    }

    #[test]
    fn a_reused_address_pair_is_a_new_connection() {
        let mut pairs = Pairs::default();
        let old = pairs.join(1, end(40000), end(80), |_, _| false);
        // The old client's socket is gone: the next connection between the
        // same ends does not take its nonce.
        let new = pairs.join(3, end(80), end(40000), |_, _| false);
        assert_ne!(old, new);
        assert!(!pairs.both_here(new, end(80), end(40000)));
        pairs.retain(|sk, nonce| sk == 3 && nonce == new.nonce);
        assert_eq!(pairs.len(), 1);
        pairs.retain(|_, _| false);
        assert_eq!(pairs.len(), 0);
    }
}
