//! The `tls` object of a connection record.

use std::sync::Arc;

use observer_common::{
    tls::{library, TLS_HS_DONE, TLS_HS_STARTED, TLS_MIDSTREAM, TLS_PLAINTEXT, TLS_WIRE_12},
    Conn, TlsConn,
};
use serde::Serialize;

use crate::{
    clock::Clock,
    record::{Direction, State},
};

/// How `ttfb_ns` was measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TtfbSource {
    /// From the plaintext calls: exact.
    Plaintext,
    /// From socket I/O after the handshake: servers only (request in,
    /// answer out). A client's socket cannot tell the answer's first byte
    /// from TLS 1.3 session tickets, which arrive like answer bytes.
    Socket,
    /// From the TLS records on the wire after a full TLS 1.2 handshake (no
    /// session tickets after it): the first application record each way.
    Wire,
}

/// Where the `tls` object's times come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TlsSource {
    /// The TLS library's own calls (uprobes).
    Library,
    /// The TLS record headers in the packets: no library probe saw the
    /// session (Java, Go, rustls, a stripped binary); `library` is null.
    Wire,
}

/// Why a connection that moved data after its handshake has no `ttfb_ns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TtfbUnmeasured {
    /// A client without plaintext probes: its socket would have taken a
    /// session ticket for the first byte.
    ClientSocketOnly,
    /// The plaintext probes came on after the connection's first exchange.
    PlaintextLate,
    /// Read on the wire, not a full TLS 1.2 handshake: the answer's first
    /// record cannot be told from TLS 1.3 session tickets.
    WireTls13,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct TlsRecord {
    /// null: read on the wire (`source` "wire").
    pub library: Option<&'static str>,
    pub source: TlsSource,
    /// Client side: from the TCP connection's establishment to the first TLS
    /// call on it (the client's TLS setup, e.g. creating its SSL_CTX).
    /// `setup_ns + handshake_ns` is curl's `time_appconnect - time_connect`.
    pub setup_ns: Option<u64>,
    /// From the first handshake call on the session to the call that
    /// completed it, across non-blocking retries.
    pub handshake_ns: Option<u64>,
    /// The library's last return value of a handshake that did not complete.
    pub handshake_error: Option<i32>,
    pub server_name: Option<Arc<str>>,
    /// "1.2", "1.3": read from Go's connection, or a TLS 1.2 handshake on
    /// the wire; null where not read (the C libraries' probes do not).
    pub version: Option<&'static str>,
    pub ttfb_ns: Option<u64>,
    pub ttfb_source: Option<TtfbSource>,
    /// Request/response turns (null without plaintext probes).
    pub exchanges: Option<u32>,
    pub plaintext_sent: Option<u64>,
    pub plaintext_received: Option<u64>,
    /// Wall-clock starts of the handshake and of the wait for the first
    /// byte, for the exporters' spans.
    #[serde(skip)]
    pub handshake_start_unix_ns: Option<u64>,
    #[serde(skip)]
    pub ttfb_start_unix_ns: Option<u64>,
    #[serde(skip)]
    pub ttfb_unmeasured: Option<TtfbUnmeasured>,
}

/// A protocol version as the wire writes it.
fn version_name(v: u16) -> Option<&'static str> {
    match v {
        0x0301 => Some("1.0"),
        0x0302 => Some("1.1"),
        0x0303 => Some("1.2"),
        0x0304 => Some("1.3"),
        _ => None,
    }
}

fn span(a: u64, b: u64) -> Option<u64> {
    (a != 0 && b != 0 && b >= a).then(|| b - a)
}

impl TlsRecord {
    /// None when no TLS was seen on the connection.
    pub fn new(
        t: &TlsConn,
        conn: &Conn,
        direction: Direction,
        state: State,
        server_name: Option<Arc<str>>,
        clock: Option<&Clock>,
    ) -> Option<Self> {
        if t.library == 0 {
            return None;
        }
        if t.library == library::WIRE {
            return Some(Self::from_wire(t, direction, state, server_name, clock));
        }
        let first_rx_ns = conn.first_rx_ns;
        let done = t.flags & TLS_HS_DONE != 0;
        let measured = t.flags & TLS_MIDSTREAM == 0 && t.flags & TLS_HS_STARTED != 0;
        // A server that calls the handshake function before the ClientHello
        // is there (a blocking accept) waits for the client's setup: its
        // handshake starts when it reads the ClientHello.
        let start = match direction {
            Direction::Inbound if first_rx_ns > t.hs_start_ns && first_rx_ns <= t.hs_end_ns => {
                first_rx_ns
            }
            _ => t.hs_start_ns,
        };
        let handshake_ns = if done && measured {
            span(start, t.hs_end_ns)
        } else {
            None
        };
        // A handshake still running in an open connection has not failed.
        let handshake_error = (measured && !done && state == State::Closed).then_some(t.hs_ret);
        let plaintext = t.flags & TLS_PLAINTEXT != 0;
        let exchanges = match direction {
            Direction::Outbound => t.exchanges_client,
            Direction::Inbound => t.exchanges_server,
        };
        let (ttfb_from, ttfb_ns, ttfb_source, ttfb_unmeasured) =
            Self::library_ttfb(t, direction, plaintext);
        let wall = |ns: u64| clock.map(|c| c.to_unix_ns(ns));
        let setup_ns = match direction {
            Direction::Outbound if measured => span(conn.established_ns, t.hs_start_ns),
            _ => None,
        };
        Some(Self {
            library: Some(library::name(t.library)),
            source: TlsSource::Library,
            setup_ns,
            handshake_ns,
            handshake_error,
            server_name,
            // rustls's handshake is read on the wire (its ServerHello).
            version: version_name(t.version).or((t.flags & TLS_WIRE_12 != 0).then_some("1.2")),
            ttfb_ns,
            ttfb_source,
            exchanges: plaintext.then_some(exchanges),
            plaintext_sent: plaintext.then_some(t.pt_sent),
            plaintext_received: plaintext.then_some(t.pt_received),
            handshake_start_unix_ns: handshake_ns.and_then(|_| wall(start)),
            ttfb_start_unix_ns: ttfb_ns.and_then(|_| wall(ttfb_from)),
            ttfb_unmeasured,
        })
    }

    /// The wait for the first byte from the library's probes: where it
    /// started, how long it took and how it was measured, or why it was
    /// not (then the start is 0).
    fn library_ttfb(
        t: &TlsConn,
        direction: Direction,
        plaintext: bool,
    ) -> (u64, Option<u64>, Option<TtfbSource>, Option<TtfbUnmeasured>) {
        let (pt, sock) = match direction {
            Direction::Outbound => (
                (t.pt_first_write_ns, t.pt_read_after_write_ns),
                (t.sk_send_after_hs_ns, t.sk_recv_after_send_ns),
            ),
            Direction::Inbound => (
                (t.pt_first_read_ns, t.pt_write_after_read_ns),
                (t.sk_recv_after_hs_ns, t.sk_send_after_recv_ns),
            ),
        };
        // The socket stands in only where it cannot be wrong: on a server
        // whose plaintext probes were never on during this connection.
        match (span(pt.0, pt.1), span(sock.0, sock.1)) {
            (Some(v), _) => (pt.0, Some(v), Some(TtfbSource::Plaintext), None),
            (None, Some(_)) if plaintext => (0, None, None, Some(TtfbUnmeasured::PlaintextLate)),
            (None, Some(_)) if direction == Direction::Outbound => {
                (0, None, None, Some(TtfbUnmeasured::ClientSocketOnly))
            }
            (None, Some(v)) => (sock.0, Some(v), Some(TtfbSource::Socket), None),
            (None, None) => (0, None, None, None),
        }
    }
}

impl TlsRecord {
    /// A handshake read from the record headers on the wire: from the
    /// ClientHello to the client's Finished (TLS 1.3) or the server's last
    /// flight (TLS 1.2), as the packets passed this host's stack; the first
    /// byte only after a full TLS 1.2 handshake.
    fn from_wire(
        t: &TlsConn,
        direction: Direction,
        state: State,
        server_name: Option<Arc<str>>,
        clock: Option<&Clock>,
    ) -> Self {
        let done = t.flags & TLS_HS_DONE != 0;
        let handshake_ns = if done {
            span(t.hs_start_ns, t.hs_end_ns)
        } else {
            None
        };
        let tls12 = t.flags & TLS_WIRE_12 != 0;
        let (from, to) = match direction {
            Direction::Outbound => (t.sk_send_after_hs_ns, t.sk_recv_after_send_ns),
            Direction::Inbound => (t.sk_recv_after_hs_ns, t.sk_send_after_recv_ns),
        };
        let ttfb_ns = if tls12 { span(from, to) } else { None };
        // Moved data after its handshake, and no first byte to give for it.
        let ttfb_unmeasured =
            (done && !tls12 && state == State::Closed).then_some(TtfbUnmeasured::WireTls13);
        let wall = |ns: u64| clock.map(|c| c.to_unix_ns(ns));
        Self {
            library: None,
            source: TlsSource::Wire,
            setup_ns: None,
            handshake_ns,
            handshake_error: None,
            server_name,
            version: version_name(t.version).or(tls12.then_some("1.2")),
            ttfb_ns,
            ttfb_source: ttfb_ns.map(|_| TtfbSource::Wire),
            exchanges: None,
            plaintext_sent: None,
            plaintext_received: None,
            handshake_start_unix_ns: handshake_ns.and_then(|_| wall(t.hs_start_ns)),
            ttfb_start_unix_ns: ttfb_ns.and_then(|_| wall(from)),
            ttfb_unmeasured,
        }
    }
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "a panic is a test failure")]
mod tests {
    use observer_common::tls::TLS_LAST_READ;

    use super::*;

    fn est(established_ns: u64) -> Conn {
        Conn {
            established_ns,
            ..Conn::default()
        }
    }

    fn client() -> TlsConn {
        TlsConn {
            hs_start_ns: 1_000,
            hs_end_ns: 4_000,
            pt_first_write_ns: 5_000,
            pt_first_read_ns: 9_000,
            pt_read_after_write_ns: 9_000,
            sk_send_after_hs_ns: 5_100,
            sk_recv_after_send_ns: 6_000,
            pt_sent: 70,
            pt_received: 700,
            exchanges_client: 2,
            library: library::OPENSSL,
            flags: TLS_HS_STARTED | TLS_HS_DONE | TLS_PLAINTEXT | TLS_LAST_READ,
            ..TlsConn::default()
        }
    }

    #[test]
    fn plaintext_timing_wins_over_socket_timing() {
        let r = TlsRecord::new(
            &client(),
            &est(400),
            Direction::Outbound,
            State::Closed,
            None,
            Some(&Clock::with_offset(1_000_000)),
        )
        .unwrap();
        assert_eq!(r.setup_ns, Some(600));
        assert_eq!(r.handshake_start_unix_ns, Some(1_001_000));
        assert_eq!(r.ttfb_start_unix_ns, Some(1_005_000));
        assert_eq!(r.handshake_ns, Some(3_000));
        assert_eq!(r.handshake_error, None);
        assert_eq!(
            (r.ttfb_ns, r.ttfb_source),
            (Some(4_000), Some(TtfbSource::Plaintext))
        );
        assert_eq!(r.exchanges, Some(2));
        assert_eq!(
            (r.plaintext_sent, r.plaintext_received),
            (Some(70), Some(700))
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["ttfb_source"], "plaintext");
        assert_eq!(json["library"], "openssl");
    }

    #[test]
    fn without_plaintext_probes_socket_timing_and_nulls() {
        let t = TlsConn {
            flags: TLS_HS_STARTED | TLS_HS_DONE,
            pt_first_write_ns: 0,
            pt_read_after_write_ns: 0,
            ..client()
        };
        // A client's socket is not trusted: a session ticket looks like
        // the answer.
        let r =
            TlsRecord::new(&t, &est(0), Direction::Outbound, State::Closed, None, None).unwrap();
        assert_eq!((r.ttfb_ns, r.ttfb_source), (None, None));
        assert_eq!(r.ttfb_unmeasured, Some(TtfbUnmeasured::ClientSocketOnly));
        assert_eq!(
            (r.exchanges, r.plaintext_sent, r.plaintext_received),
            (None, None, None)
        );
        // A server's is: the request in, then the answer out.
        let served = TlsConn {
            sk_recv_after_hs_ns: 5_000,
            sk_send_after_recv_ns: 7_500,
            ..t
        };
        let r = TlsRecord::new(
            &served,
            &est(0),
            Direction::Inbound,
            State::Closed,
            None,
            None,
        )
        .unwrap();
        assert_eq!(
            (r.ttfb_ns, r.ttfb_source),
            (Some(2_500), Some(TtfbSource::Socket))
        );
        assert_eq!(r.ttfb_unmeasured, None);
    }

    #[test]
    fn plaintext_probes_that_missed_the_first_exchange_give_no_time() {
        let late = TlsConn {
            pt_first_read_ns: 0,
            pt_write_after_read_ns: 0,
            sk_recv_after_hs_ns: 5_000,
            sk_send_after_recv_ns: 7_500,
            ..client()
        };
        for dir in [Direction::Outbound, Direction::Inbound] {
            let t = TlsConn {
                pt_first_write_ns: 0,
                pt_read_after_write_ns: 0,
                ..late
            };
            let r = TlsRecord::new(&t, &est(0), dir, State::Closed, None, None).unwrap();
            assert_eq!((r.ttfb_ns, r.ttfb_source), (None, None), "{dir:?}");
            assert_eq!(r.ttfb_unmeasured, Some(TtfbUnmeasured::PlaintextLate));
        }
    }

    #[test]
    fn failed_midstream_and_absent() {
        let failed = TlsConn {
            flags: TLS_HS_STARTED,
            hs_end_ns: 0,
            hs_ret: -1,
            ..client()
        };
        let r = TlsRecord::new(
            &failed,
            &est(0),
            Direction::Outbound,
            State::Closed,
            None,
            None,
        )
        .unwrap();
        assert_eq!((r.handshake_ns, r.handshake_error), (None, Some(-1)));
        let open = TlsRecord::new(
            &failed,
            &est(0),
            Direction::Outbound,
            State::Open,
            None,
            None,
        )
        .unwrap();
        assert_eq!(
            open.handshake_error, None,
            "still handshaking is not a failure"
        );
        let mid = TlsConn {
            flags: TLS_MIDSTREAM | TLS_HS_DONE,
            ..client()
        };
        let r = TlsRecord::new(
            &mid,
            &est(0),
            Direction::Outbound,
            State::Closed,
            None,
            None,
        )
        .unwrap();
        assert_eq!((r.handshake_ns, r.handshake_error), (None, None));
        assert_eq!(
            TlsRecord::new(
                &TlsConn::default(),
                &est(0),
                Direction::Inbound,
                State::Closed,
                None,
                None
            ),
            None
        );
    }

    #[test]
    fn a_blocking_server_handshake_starts_at_the_client_hello() {
        let conn = Conn {
            first_rx_ns: 1_500,
            ..Conn::default()
        };
        let r = TlsRecord::new(
            &client(),
            &conn,
            Direction::Inbound,
            State::Closed,
            None,
            None,
        )
        .unwrap();
        assert_eq!(r.handshake_ns, Some(2_500));
        assert_eq!(r.setup_ns, None);
    }

    #[test]
    fn server_side_runs_from_request_to_answer() {
        let t = TlsConn {
            pt_first_read_ns: 10_000,
            pt_write_after_read_ns: 15_000,
            exchanges_server: 3,
            library: library::GNUTLS,
            flags: TLS_HS_STARTED | TLS_HS_DONE | TLS_PLAINTEXT,
            ..client()
        };
        let r = TlsRecord::new(
            &t,
            &est(0),
            Direction::Inbound,
            State::Closed,
            Some("x".into()),
            None,
        )
        .unwrap();
        assert_eq!((r.ttfb_ns, r.exchanges), (Some(5_000), Some(3)));
        assert_eq!(r.library, Some("gnutls"));
        assert_eq!(r.server_name.as_deref(), Some("x"));
    }

    /// A handshake read on the wire: library null; the first byte only
    /// after a full TLS 1.2 handshake, else none and the reason.
    #[test]
    fn from_the_wire() {
        use observer_common::tls::{wire, TLS_WIRE_12};
        let t13 = TlsConn {
            hs_start_ns: 1_000,
            hs_end_ns: 4_000,
            library: library::WIRE,
            flags: TLS_HS_STARTED | TLS_HS_DONE,
            wire_stage: wire::DONE,
            ..TlsConn::default()
        };
        let r = TlsRecord::new(
            &t13,
            &est(400),
            Direction::Outbound,
            State::Closed,
            None,
            None,
        )
        .unwrap();
        assert_eq!((r.library, r.source), (None, TlsSource::Wire));
        assert_eq!(
            (r.handshake_ns, r.ttfb_ns, r.version),
            (Some(3_000), None, None)
        );
        assert_eq!(r.ttfb_unmeasured, Some(TtfbUnmeasured::WireTls13));
        let t12 = TlsConn {
            flags: TLS_HS_STARTED | TLS_HS_DONE | TLS_WIRE_12,
            sk_send_after_hs_ns: 5_000,
            sk_recv_after_send_ns: 9_000,
            sk_recv_after_hs_ns: 5_100,
            sk_send_after_recv_ns: 8_000,
            ..t13
        };
        let client = TlsRecord::new(
            &t12,
            &est(400),
            Direction::Outbound,
            State::Closed,
            None,
            None,
        )
        .unwrap();
        assert_eq!(
            (client.ttfb_ns, client.ttfb_source, client.version),
            (Some(4_000), Some(TtfbSource::Wire), Some("1.2"))
        );
        assert_eq!(client.ttfb_unmeasured, None);
        let server = TlsRecord::new(
            &t12,
            &est(400),
            Direction::Inbound,
            State::Closed,
            None,
            None,
        )
        .unwrap();
        assert_eq!(server.ttfb_ns, Some(2_900));
        // Not finished: no handshake time, nothing counted.
        let open = TlsConn {
            flags: TLS_HS_STARTED,
            hs_end_ns: 0,
            ..t13
        };
        let r = TlsRecord::new(
            &open,
            &est(400),
            Direction::Outbound,
            State::Closed,
            None,
            None,
        )
        .unwrap();
        assert_eq!((r.handshake_ns, r.ttfb_unmeasured), (None, None));
    }
}
