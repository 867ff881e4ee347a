//! The connection record: what `observer watch --json` prints, one per line.
//!
//! Field names are a contract (docs/records.md): later work adds fields,
//! never renames these.

use std::{net::IpAddr, sync::Arc};

use observer_common::{
    Conn, DIR_INBOUND, FLAG_ESTABLISHED, FLAG_MIDSTREAM, FLAG_OWNED, FLAG_RESET_RX,
};
use serde::Serialize;

use crate::clock::Clock;

pub(crate) use crate::fields::addr;
pub use crate::fields::{
    comm_str, comm_str_n, ip_of, ip_text, push_ip, Direction, Family, Host, State,
};

/// The process a connection belongs to, as userspace resolved it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    pub pid: u32,
    pub tid: u32,
    /// Process name (`/proc/PID/comm`), or the kernel's thread name when the
    /// process was already gone. Shared (one allocation per process or name),
    /// since tens of thousands of live connections may hold one.
    pub comm: Arc<str>,
    /// The kernel's name of the thread that connected or first did I/O.
    pub thread_comm: Arc<str>,
    pub exe: Option<Arc<str>>,
    pub container: Option<Arc<crate::k8s::Container>>,
}

#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ConnRecord {
    /// Always "connection" (DNS records will carry "dns").
    #[schemars(extend("const" = "connection"))]
    pub kind: &'static str,
    pub state: State,
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    // Shared with the connection table: a record costs no string copies.
    pub comm: Option<Arc<str>>,
    pub thread_comm: Option<Arc<str>>,
    pub exe: Option<Arc<str>>,
    /// The process's container and Kubernetes pod (null: none).
    pub container: Option<Arc<crate::k8s::Container>>,
    pub direction: Direction,
    pub family: Family,
    /// Serialized as its text form (serde does so for IpAddr in JSON).
    pub local_addr: IpAddr,
    pub local_port: u16,
    pub remote_addr: IpAddr,
    pub remote_port: u16,
    pub start_unix_ns: u64,
    pub end_unix_ns: Option<u64>,
    pub duration_ns: Option<u64>,
    pub connect_ns: Option<u64>,
    pub ttfb_ns: Option<u64>,
    /// Payload bytes each way: the kernel's own counters (sent less
    /// retransmitted, received in order), read when the record is made.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// TCP segments that carried data, each way (`tcp_info`'s
    /// data_segs_out, data_segs_in). They replace per-call counts
    /// (`send_calls`, `recv_calls`): no per-call hook is on any data path.
    pub segments_sent: u32,
    pub segments_received: u32,
    pub retransmits: u32,
    pub resets: u32,
    pub resets_sent: u32,
    pub resets_received: u32,
    pub srtt_us: Option<u32>,
    pub error: Option<&'static str>,
    /// TLS phases (null when no TLS library call was seen on the connection).
    pub tls: Option<crate::tls::TlsRecord>,
    /// The GPUs the process held a context on during the connection (null:
    /// none, or GPU features off).
    pub gpu: Option<crate::gpu::GpuRecord>,
    /// `observer.diagnosis.cause`, judged once by the correlator for the
    /// metrics and the span (None: not judged yet; see `cause`).
    #[serde(skip)]
    pub diagnosis: Option<&'static str>,
    /// The lookup that led to this connection (outbound; null: none seen).
    pub dns: Option<crate::dns::DnsJoin>,
    /// HTTP/2 connections: streams, resets and GOAWAYs seen, and what could
    /// not be read (null: not HTTP/2, or its plaintext was not seen).
    pub http2: Option<H2Counts>,
    /// HTTP requests seen on the connection by its close (HTTP/1.x
    /// exchanges, or HTTP/2 streams begun); null: no HTTP seen, or an open
    /// connection's snapshot.
    pub requests: Option<u32>,
    /// Which end closed the connection: "client" or "server" (the first
    /// FIN, by role: the owner is the client of an outbound connection),
    /// "reset" (either way), or "goaway" (HTTP/2); null: still open, or
    /// never established.
    pub closed_by: Option<&'static str>,
    /// The connection was established before the observer started (or
    /// fell out of its table): followed from its first packet seen, which
    /// is `start_unix_ns`; its connect and first bytes are unknown (null).
    pub began_before_observer: bool,
    /// Wall-clock times of the first byte each way, for the exporters' spans
    /// (the JSON carries the durations).
    #[serde(skip)]
    pub first_tx_unix_ns: Option<u64>,
    #[serde(skip)]
    pub first_rx_unix_ns: Option<u64>,
    /// When the peer's FIN arrived (the peer closed first).
    #[serde(skip)]
    pub peer_fin_unix_ns: Option<u64>,
    /// The connection's identity for trace ids shared by its records (its
    /// socket and start: a socket's address is reused by later connections).
    #[serde(skip)]
    pub conn_key: u64,
    /// What the trace of the connection's first request already shows (its
    /// phases; `waited`: its own wait for the first byte as well): the
    /// connection's trace then holds only the rest.
    #[serde(skip)]
    pub first_request: Option<FirstRequest>,
}

/// What one HTTP/2 connection's frames showed, on its connection record.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
pub struct H2Counts {
    /// Streams begun (request HEADERS seen).
    pub streams: u32,
    /// RST_STREAM frames, either way.
    pub resets: u32,
    /// GOAWAY frames, either way.
    pub goaways: u32,
    /// Header blocks that could not be decoded.
    pub undecodable_headers: u64,
    /// Times a direction's frames were lost track of (a frame header among
    /// the bytes not copied).
    pub out_of_step: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FirstRequest {
    pub waited: bool,
    /// Its trace and root span (see `RequestRecord::trace`).
    pub trace: Option<([u8; 16], [u8; 8])>,
}

/// Names an errno reported on the socket.
fn errno_word(errno: u32) -> &'static str {
    match errno as i32 {
        libc::ECONNREFUSED => "refused",
        libc::ETIMEDOUT => "timeout",
        libc::EHOSTUNREACH | libc::ENETUNREACH => "unreachable",
        libc::ECONNRESET | libc::EPIPE => "reset",
        libc::ECONNABORTED => "aborted",
        _ => "error",
    }
}

/// How a connection ended, from what the kernel saw.
pub fn error_of(conn: &Conn, state: State) -> Option<&'static str> {
    let established = conn.flags & FLAG_ESTABLISHED != 0;
    if conn.error != 0 {
        return Some(errno_word(conn.error));
    }
    if conn.flags & FLAG_RESET_RX != 0 {
        return Some(if established { "reset" } else { "refused" });
    }
    if state == State::Closed && !established {
        // Closed by its owner before the handshake completed (a client timeout).
        return Some("aborted");
    }
    None
}

/// `b - a` when both happened and in that order.
fn span(a: u64, b: u64) -> Option<u64> {
    (a != 0 && b != 0 && b >= a).then(|| b - a)
}

impl ConnRecord {
    /// Who closed this closed record's connection (see `closed_by`);
    /// `established`: the kernel saw it established.
    pub fn who_closed(&self, established: bool) -> Option<&'static str> {
        if self.state != State::Closed || !established {
            return None;
        }
        if self.resets > 0 {
            return Some("reset");
        }
        if self.http2.as_ref().is_some_and(|h| h.goaways > 0) {
            return Some("goaway");
        }
        let owner_is_client = self.direction == Direction::Outbound;
        let owner_closed = self.peer_fin_unix_ns.is_none();
        Some(if owner_closed == owner_is_client {
            "client"
        } else {
            "server"
        })
    }

    /// The answer's first byte: on TLS the `tls` object's only (the
    /// socket's first byte back is the server's handshake flight).
    pub fn answer_ttfb_ns(&self) -> Option<u64> {
        match &self.tls {
            Some(t) => t.ttfb_ns,
            None => self.ttfb_ns,
        }
    }

    /// Builds the record of `conn`. `owner` is what userspace resolved when the
    /// connection got its process; without it the kernel's view is used.
    pub fn new(conn: &Conn, owner: Option<&Owner>, clock: &Clock, state: State) -> Self {
        let direction = if conn.direction == DIR_INBOUND {
            Direction::Inbound
        } else {
            Direction::Outbound
        };
        let (family, remote) = addr(conn.family, &conn.daddr);
        let (_, local) = addr(conn.family, &conn.saddr);
        let owned = conn.flags & FLAG_OWNED != 0;
        let kernel;
        let owner = match owner {
            None if owned => {
                kernel = Self::kernel_owner(conn);
                Some(&kernel)
            }
            o => o,
        };
        let midstream = conn.flags & FLAG_MIDSTREAM != 0;
        let (connect_ns, ttfb_ns) = Self::connect_and_ttfb(conn, direction, midstream);
        let end_ns = (state == State::Closed && conn.end_ns != 0).then_some(conn.end_ns);
        Self {
            kind: "connection",
            state,
            pid: owner.map(|o| o.pid),
            tid: owner.map(|o| o.tid),
            comm: owner.map(|o| Arc::clone(&o.comm)),
            thread_comm: owner.map(|o| Arc::clone(&o.thread_comm)),
            exe: owner.and_then(|o| o.exe.clone()),
            container: owner.and_then(|o| o.container.clone()),
            direction,
            family,
            local_addr: local,
            local_port: conn.sport,
            remote_addr: remote,
            remote_port: conn.dport,
            start_unix_ns: clock.to_unix_ns(conn.start_ns),
            end_unix_ns: end_ns.map(|e| clock.to_unix_ns(e)),
            duration_ns: end_ns.and_then(|e| span(conn.start_ns, e)),
            connect_ns,
            ttfb_ns,
            bytes_sent: conn.bytes_tx,
            bytes_received: conn.bytes_rx,
            segments_sent: conn.segs_out,
            segments_received: conn.segs_in,
            retransmits: conn.retransmits,
            resets: u32::from(conn.resets_rx) + u32::from(conn.resets_tx),
            resets_sent: u32::from(conn.resets_tx),
            resets_received: u32::from(conn.resets_rx),
            srtt_us: (conn.srtt_us != 0).then_some(conn.srtt_us),
            error: error_of(conn, state),
            tls: None,
            gpu: None,
            diagnosis: None,
            dns: None,
            http2: None,
            requests: None,
            closed_by: None,
            began_before_observer: midstream,
            first_tx_unix_ns: (conn.first_tx_ns != 0).then(|| clock.to_unix_ns(conn.first_tx_ns)),
            first_rx_unix_ns: (conn.first_rx_ns != 0).then(|| clock.to_unix_ns(conn.first_rx_ns)),
            peer_fin_unix_ns: (conn.peer_fin_ns != 0).then(|| clock.to_unix_ns(conn.peer_fin_ns)),
            conn_key: conn.sk ^ conn.start_ns.rotate_left(32),
            first_request: None,
        }
    }

    /// The process of a connection userspace has not resolved, as the
    /// kernel saw it: its name stands for the thread's too (one string).
    fn kernel_owner(conn: &Conn) -> Owner {
        let c: Arc<str> = Arc::from(comm_str(&conn.comm));
        Owner {
            pid: conn.pid,
            tid: conn.tid,
            comm: Arc::clone(&c),
            thread_comm: c,
            exe: None,
            container: None,
        }
    }

    /// `connect_ns` (outbound only) and `ttfb_ns` (none for a connection
    /// that began before the observer: its first bytes were not seen).
    fn connect_and_ttfb(
        conn: &Conn,
        direction: Direction,
        midstream: bool,
    ) -> (Option<u64>, Option<u64>) {
        let ttfb_ns = match direction {
            _ if midstream => None,
            Direction::Outbound => span(conn.first_tx_ns, conn.first_rx_ns),
            Direction::Inbound => span(conn.first_rx_ns, conn.first_tx_ns),
        };
        let connect_ns = match direction {
            Direction::Outbound => span(conn.start_ns, conn.established_ns),
            Direction::Inbound => None,
        };
        (connect_ns, ttfb_ns)
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use observer_common::{AF_INET, AF_INET6, DIR_OUTBOUND};

    use super::*;

    #[test]
    fn addresses_read_as_display_writes_them() {
        let mut ips: Vec<IpAddr> = [
            "0.0.0.0",
            "255.255.255.255",
            "10.0.0.1",
            "127.0.0.1",
            "100.9.10.99",
            "::1",
            "2001:db8::8a2e:370:7334",
            "::ffff:1.2.3.4",
        ]
        .iter()
        .map(|s| s.parse().expect("an address"))
        .collect();
        ips.extend((0..=255u8).map(|o| IpAddr::from([o, 255 - o, o / 3, o % 10])));
        for ip in ips {
            assert_eq!(ip_text(&ip), ip.to_string());
        }
    }

    #[test]
    fn a_kernel_name_stops_at_its_nul_and_survives_bad_bytes() {
        assert_eq!(comm_str(b"curl\0\0\0\0\0\0\0\0\0\0\0\0"), "curl");
        assert_eq!(comm_str_n(b"ab\xffc\0d"), "ab\u{fffd}c");
        assert_eq!(comm_str_n(b"sixteen-bytes-xx"), "sixteen-bytes-xx");
    }

    fn outbound() -> Conn {
        let mut c = Conn {
            sk: 1,
            start_ns: 1_000,
            established_ns: 1_500,
            first_tx_ns: 2_000,
            first_rx_ns: 5_000,
            end_ns: 9_000,
            bytes_tx: 10,
            bytes_rx: 20,
            pid: 7,
            tid: 8,
            comm: *b"curl\0\0\0\0\0\0\0\0\0\0\0\0",
            sport: 40000,
            dport: 80,
            family: AF_INET,
            direction: DIR_OUTBOUND,
            flags: FLAG_OWNED | FLAG_ESTABLISHED,
            ..Conn::default()
        };
        c.saddr[..4].copy_from_slice(&[127, 0, 0, 1]);
        c.daddr[..4].copy_from_slice(&[10, 1, 2, 3]);
        c
    }

    #[test]
    fn outbound_phases() {
        let r = ConnRecord::new(&outbound(), None, &Clock::with_offset(100), State::Closed);
        assert_eq!(r.connect_ns, Some(500));
        assert_eq!(r.ttfb_ns, Some(3_000));
        assert_eq!(r.start_unix_ns, 1_100);
        assert_eq!(r.end_unix_ns, Some(9_100));
        assert_eq!(r.duration_ns, Some(8_000));
        assert_eq!(r.remote_addr.to_string(), "10.1.2.3");
        assert_eq!(r.local_addr.to_string(), "127.0.0.1");
        let json = serde_json::to_value(&r).expect("serializes");
        assert_eq!(json["remote_addr"], "10.1.2.3");
        assert_eq!(r.pid, Some(7));
        assert_eq!(r.comm.as_deref(), Some("curl"));
        assert_eq!(r.error, None);
        assert_eq!(r.family, Family::Ipv4);
    }

    #[test]
    fn inbound_ttfb_runs_from_request_to_response() {
        let c = Conn {
            direction: DIR_INBOUND,
            first_rx_ns: 2_000,
            first_tx_ns: 7_000,
            ..outbound()
        };
        let r = ConnRecord::new(&c, None, &Clock::with_offset(0), State::Closed);
        assert_eq!(r.ttfb_ns, Some(5_000));
        assert_eq!(r.connect_ns, None);
        assert_eq!(r.direction, Direction::Inbound);
    }

    #[test]
    fn missing_phases_are_null() {
        let c = Conn {
            first_rx_ns: 0,
            established_ns: 0,
            flags: FLAG_OWNED,
            ..outbound()
        };
        let r = ConnRecord::new(&c, None, &Clock::with_offset(0), State::Open);
        assert_eq!(r.ttfb_ns, None);
        assert_eq!(r.connect_ns, None);
        assert_eq!(r.end_unix_ns, None);
        assert_eq!(r.error, None, "an open connection has not failed");
        let json = serde_json::to_value(&r).expect("serializes");
        assert!(json["ttfb_ns"].is_null());
        assert_eq!(json["state"], "open");
    }

    #[test]
    fn errors() {
        let refused = Conn {
            flags: FLAG_OWNED | FLAG_RESET_RX,
            ..outbound()
        };
        assert_eq!(error_of(&refused, State::Closed), Some("refused"));
        let reset = Conn {
            flags: FLAG_OWNED | FLAG_ESTABLISHED | FLAG_RESET_RX,
            ..outbound()
        };
        assert_eq!(error_of(&reset, State::Closed), Some("reset"));
        let timeout = Conn {
            flags: FLAG_OWNED,
            error: libc::ETIMEDOUT as u32,
            ..outbound()
        };
        assert_eq!(error_of(&timeout, State::Closed), Some("timeout"));
        let unreachable = Conn {
            error: libc::EHOSTUNREACH as u32,
            ..timeout
        };
        assert_eq!(error_of(&unreachable, State::Closed), Some("unreachable"));
        let aborted = Conn {
            flags: FLAG_OWNED,
            ..outbound()
        };
        assert_eq!(error_of(&aborted, State::Closed), Some("aborted"));
    }

    #[test]
    fn v4_mapped_addresses_are_ipv4() {
        let mut c = Conn {
            family: AF_INET6,
            ..outbound()
        };
        c.daddr = Ipv6Addr::from(Ipv4Addr::new(127, 0, 0, 1).to_ipv6_mapped().octets()).octets();
        c.saddr = Ipv6Addr::LOCALHOST.octets();
        let r = ConnRecord::new(&c, None, &Clock::with_offset(0), State::Closed);
        assert_eq!(r.remote_addr.to_string(), "127.0.0.1");
        assert_eq!(r.family, Family::Ipv4);
        assert_eq!(r.local_addr.to_string(), "::1");
    }
}
