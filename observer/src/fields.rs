//! The fields every record kind shares: a record's state and direction, an
//! address's family and text, a peer's host and a kernel name's text. A
//! leaf: the feature records (DNS, TLS, HTTP) use these and the connection
//! record holds those.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use observer_common::AF_INET6;
use serde::Serialize;

/// Whether a record is final or a snapshot of a connection that is still open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Closed,
    Open,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Outbound,
    Inbound,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    Ipv4,
    Ipv6,
}

/// The kernel's thread name: bytes up to the first NUL.
pub fn comm_str(comm: &[u8; 16]) -> String {
    comm_str_n(comm)
}

/// A NUL-terminated kernel string of any fixed size.
pub fn comm_str_n(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let bytes = &bytes[..end];
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// An address as `Display` writes it. IPv4 by hand: under connection churn
/// the formatting machinery (width and padding support no address needs)
/// was 7% of the daemon's CPU, spans and metrics naming each peer.
pub fn ip_text(ip: &IpAddr) -> String {
    let mut s = String::with_capacity(15);
    push_ip(&mut s, ip);
    s
}

/// Appends the address as `ip_text` writes it.
pub fn push_ip(s: &mut String, ip: &IpAddr) {
    match ip {
        IpAddr::V4(v4) => s.push_str(V4Digits::of(v4).as_str()),
        IpAddr::V6(_) => {
            use std::fmt::Write as _;
            let _ = write!(s, "{ip}");
        }
    }
}

/// An IPv4 address's dotted digits, on the stack.
struct V4Digits {
    b: [u8; 15],
    n: usize,
}

impl V4Digits {
    fn of(v4: &std::net::Ipv4Addr) -> V4Digits {
        let mut d = V4Digits { b: [0; 15], n: 0 };
        for (i, &o) in v4.octets().iter().enumerate() {
            if i > 0 {
                d.push(b'.');
            }
            if o >= 100 {
                d.push(b'0' + o / 100);
            }
            if o >= 10 {
                d.push(b'0' + o / 10 % 10);
            }
            d.push(b'0' + o % 10);
        }
        d
    }

    fn push(&mut self, c: u8) {
        self.b[self.n] = c;
        self.n += 1;
    }

    fn as_str(&self) -> &str {
        // Digits and dots only.
        std::str::from_utf8(&self.b[..self.n]).unwrap_or_default()
    }
}

/// A peer as spans name it: the name it was reached by, or its address.
#[derive(Debug, Clone, Copy)]
pub enum Host<'a> {
    Name(&'a str),
    Ip(&'a IpAddr),
}

impl Host<'_> {
    /// Appends the name or address to `s` (what Display writes, without
    /// the formatting machinery).
    pub fn push_to(&self, s: &mut String) {
        match self {
            Host::Name(n) => s.push_str(n),
            Host::Ip(ip) => push_ip(s, ip),
        }
    }
}

impl std::fmt::Display for Host<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V4(v4)) => f.write_str(V4Digits::of(v4).as_str()),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Formats a tracepoint address; v4-mapped IPv6 addresses are reported as the
/// IPv4 address they carry, since that is what went on the wire.
pub(crate) fn addr(family: u16, bytes: &[u8; 16]) -> (Family, IpAddr) {
    if family == AF_INET6 {
        let v6 = Ipv6Addr::from(*bytes);
        match v6.to_ipv4_mapped() {
            Some(v4) => (Family::Ipv4, IpAddr::V4(v4)),
            None => (Family::Ipv6, IpAddr::V6(v6)),
        }
    } else {
        let v4 = Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]);
        (Family::Ipv4, IpAddr::V4(v4))
    }
}

/// The address a connection event carries (None: family unknown).
pub fn ip_of(family: u16, bytes: &[u8; 16]) -> Option<IpAddr> {
    (family == observer_common::AF_INET || family == AF_INET6).then(|| addr(family, bytes).1)
}
