//! Writing records for people (aligned columns) or machines (JSON lines). Reads
//! finished records only.

use std::io::{self, Write};

use crate::{
    record::{ConnRecord, Direction, State},
    units::{fmt_bytes, fmt_ns, fmt_time},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

pub const HEADER: &str = "TIME(UTC)     PID      COMM             DIR  REMOTE                                  LOCAL                                   CONNECT      TLS      TTFB  DURATION      SENT      RECV  RTX  SRTT     ERROR  SERVER-NAME";

fn endpoint(addr: &std::net::IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(*addr, port).to_string()
}

pub fn text_line(r: &ConnRecord) -> String {
    let time = fmt_time(r.end_unix_ns.unwrap_or(r.start_unix_ns));
    let pid = r.pid.map_or("-".into(), |p| p.to_string());
    let comm = r.comm.as_deref().unwrap_or("-");
    let dir = match r.direction {
        Direction::Outbound => "out",
        Direction::Inbound => "in",
    };
    let status = match (r.state, r.error) {
        (_, Some(e)) => e,
        (State::Open, None) => "(open)",
        (State::Closed, None) => "-",
    };
    // On TLS the socket's first bytes are the handshake: show the TLS
    // library's view (or a server's socket view after the handshake).
    let (tls_hs, ttfb) = match &r.tls {
        Some(t) => (fmt_ns(t.handshake_ns), fmt_ns(t.ttfb_ns)),
        None => ("-".into(), fmt_ns(r.ttfb_ns)),
    };
    let name = r
        .tls
        .as_ref()
        .and_then(|t| t.server_name.as_deref())
        .unwrap_or("");
    format!(
        "{time:<13} {pid:<8} {comm:<16} {dir:<4} {:<39} {:<39} {:>8} {tls_hs:>8} {ttfb:>9} {:>9} {:>9} {:>9} {:>4} {:>8} {status}  {name}",
        endpoint(&r.remote_addr, r.remote_port),
        endpoint(&r.local_addr, r.local_port),
        fmt_ns(r.connect_ns),
        fmt_ns(r.duration_ns),
        fmt_bytes(r.bytes_sent),
        fmt_bytes(r.bytes_received),
        r.retransmits,
        fmt_ns(r.srtt_us.map(|us| u64::from(us) * 1000)),
    )
}

/// What the output thread writes.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "connection records are most lines; boxing would allocate for each"
)]
pub enum Line {
    Conn(Box<ConnRecord>),
    Dns(crate::dns::DnsRecord),
    Request(Box<crate::http::RequestRecord>),
    /// `watch --pools`, `top`, `diagnose`.
    Pool(Box<crate::pools::PoolRecord>),
}

/// A pool's line: who, to where, what is open, and how it was used.
pub fn pool_text_line(r: &crate::pools::PoolRecord) -> String {
    let share = r
        .new_connection_share
        .map_or("-".into(), |s| format!("{:.0}%", s * 100.0));
    let c = &r.closed;
    format!(
        "{:<13} {:<8} {:<16} pool {:<39} open {} busy {} idle {} requests {} new {} ({share}) closed client {} server {} reset {} goaway {}  {}",
        fmt_time(r.time_unix_ns),
        r.pid,
        r.comm.as_deref().unwrap_or("-"),
        endpoint(&r.peer_addr, r.peer_port),
        r.open,
        r.busy,
        r.idle,
        r.requests,
        r.new_connections,
        c.client,
        c.server,
        c.reset,
        c.goaway,
        r.server_name.as_deref().unwrap_or(""),
    )
}

pub fn dns_text_line(r: &crate::dns::DnsRecord) -> String {
    let answers: Vec<String> = r.answers.iter().map(ToString::to_string).collect();
    let mut via = String::new();
    if let Some(server) = &r.server {
        via = format!(" via {server}/{}", r.transport.unwrap_or("udp"));
        if let Some(n) = r.retries.filter(|&n| n > 0) {
            via.push_str(&format!(
                " ({n} {})",
                if n == 1 { "retry" } else { "retries" }
            ));
        }
    }
    format!(
        "{:<13} {:<8} {:<16} dns  {} {} {} in {} -> {}{via} [{}]",
        fmt_time(r.start_unix_ns + r.duration_ns),
        r.pid,
        r.comm,
        r.name,
        r.qtype,
        r.result,
        fmt_ns(Some(r.duration_ns)),
        if answers.is_empty() {
            "-".into()
        } else {
            answers.join(" ")
        },
        r.source
    )
}

pub fn write_line(w: &mut impl Write, l: &Line, format: Format) -> io::Result<()> {
    match l {
        Line::Conn(r) => write_record(w, r, format),
        Line::Dns(r) => match format {
            Format::Json => {
                serde_json::to_writer(&mut *w, r)?;
                w.write_all(b"\n")
            }
            Format::Text => writeln!(w, "{}", dns_text_line(r)),
        },
        Line::Request(r) => match format {
            Format::Json => {
                serde_json::to_writer(&mut *w, r)?;
                w.write_all(b"\n")
            }
            Format::Text => writeln!(w, "{}", r.text_line()),
        },
        Line::Pool(r) => match format {
            Format::Json => {
                serde_json::to_writer(&mut *w, r)?;
                w.write_all(b"\n")
            }
            Format::Text => writeln!(w, "{}", pool_text_line(r)),
        },
    }
}

pub fn write_record(w: &mut impl Write, r: &ConnRecord, format: Format) -> io::Result<()> {
    match format {
        Format::Json => {
            serde_json::to_writer(&mut *w, r)?;
            w.write_all(b"\n")
        }
        Format::Text => writeln!(w, "{}", text_line(r)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lookup_line_says_what_was_asked_of_whom() {
        let mut r = crate::dns::record::tests::rec(7, 7, 0, &["10.0.0.1"]);
        r.server = Some("10.0.0.53".into());
        r.transport = Some("udp");
        r.retries = Some(1);
        let line = dns_text_line(&r);
        assert!(
            line.ends_with(
                "dns  api.test ANY ok in 0.001ms -> 10.0.0.1 via 10.0.0.53/udp (1 retry) [libc]"
            ),
            "{line}"
        );
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_ns(None), "-");
        assert_eq!(fmt_ns(Some(123_456)), "0.123ms");
        assert_eq!(fmt_ns(Some(200_400_000)), "200.4ms");
        assert_eq!(fmt_ns(Some(2_500_000_000)), "2.50s");
        assert_eq!(fmt_bytes(512), "512B");
        assert_eq!(fmt_bytes(2048), "2.0KiB");
        assert_eq!(fmt_time(3_723_004_000_000), "01:02:03.004");
        assert_eq!(endpoint(&"::1".parse().expect("ip"), 80), "[::1]:80");
    }
}
