//! How verdicts read: durations as people say them, one block per call in
//! text, one object per call in JSON.

use serde::Serialize;

use crate::cause::{
    call::Call,
    rules::{Cause, Diagnosis, Figures},
    thresholds::Thresholds,
};
use crate::units::dur;

/// `observer diagnose --json`: one per diagnosed call.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Verdict<'a> {
    /// Always "diagnosis".
    #[schemars(extend("const" = "diagnosis"))]
    pub kind: &'static str,
    pub cause: Cause,
    pub evidence: &'a str,
    /// "request" or "connection": the record the call was read from.
    pub record: &'a str,
    pub direction: &'a str,
    pub pid: Option<u32>,
    pub comm: Option<&'a str>,
    pub host: Option<&'a str>,
    pub local_addr: &'a str,
    pub local_port: u16,
    pub remote_addr: &'a str,
    pub remote_port: u16,
    pub method: Option<&'a str>,
    pub path: Option<&'a str>,
    pub status: Option<u16>,
    pub start_unix_ns: u64,
    pub figures: &'a Figures,
    pub thresholds: &'a Thresholds,
}

impl<'a> Verdict<'a> {
    pub fn new(c: &'a Call, d: &'a Diagnosis, t: &'a Thresholds) -> Self {
        Verdict {
            kind: "diagnosis",
            cause: d.cause,
            evidence: &d.evidence,
            record: c.record,
            direction: c.direction,
            pid: c.pid,
            comm: c.comm.as_deref(),
            host: c.host.as_deref(),
            local_addr: &c.local_addr,
            local_port: c.local_port,
            remote_addr: &c.remote_addr,
            remote_port: c.remote_port,
            method: c.method.as_deref(),
            path: c.path.as_deref(),
            status: c.status,
            start_unix_ns: c.start_unix_ns,
            figures: &d.figures,
            thresholds: t,
        }
    }
}

/// Two lines: what the call was, then the verdict's sentence.
pub fn block(c: &Call, d: &Diagnosis) -> String {
    let remote = endpoint(&c.remote_addr, c.remote_port);
    let what = match (&c.method, &c.path) {
        (Some(m), Some(p)) => format!("{m} {}{p}", c.host.as_deref().unwrap_or("")),
        _ => c.host.clone().unwrap_or_default(),
    };
    format!(
        "{:<13} {:>9}  {:<8} {:<8} {:<16} {} {remote} {what}\n    {}",
        crate::units::fmt_time(c.start_unix_ns),
        dur(d.figures.total_ns),
        d.cause.as_str(),
        c.pid.map_or("-".into(), |p| p.to_string()),
        c.comm.as_deref().unwrap_or("-"),
        if c.direction == "inbound" {
            "in "
        } else {
            "out"
        },
        d.evidence
    )
}

pub const HEADER: &str =
    "TIME(UTC)         TOTAL  CAUSE    PID      COMM             DIR REMOTE CALL";

/// "addr:port", bracketed for IPv6.
fn endpoint(addr: &str, port: u16) -> String {
    match addr.parse::<std::net::IpAddr>() {
        Ok(ip) => std::net::SocketAddr::new(ip, port).to_string(),
        Err(_) => format!("{addr}:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(dur(480_000_000), "480 ms");
        assert_eq!(dur(1_030_000_000), "1.03 s");
        assert_eq!(dur(2_500_000), "2.5 ms");
        assert_eq!(dur(40_000), "40 µs");
    }
}
