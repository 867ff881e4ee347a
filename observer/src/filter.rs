//! `watch` filters: which records the user wants to see.

use crate::record::{ConnRecord, Direction};

/// What to keep; empty (or None) keeps all. Built by the front end from its
/// flags (`watch::args`), so the filter does not read the command line.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub pids: Vec<u32>,
    pub comms: Vec<String>,
    pub ports: Vec<u16>,
    pub direction: Option<Direction>,
}

impl Filter {
    /// DNS records: the process filters apply; a port or direction filter
    /// asks for connections only.
    pub fn matches_dns(&self, r: &crate::dns::DnsRecord) -> bool {
        let pid_ok = self.pids.is_empty() || self.pids.contains(&r.pid);
        let comm_ok = self.comms.is_empty() || self.comms.iter().any(|c| *c == *r.comm);
        pid_ok && comm_ok && self.ports.is_empty() && self.direction.is_none()
    }

    /// Request records: as their connection's.
    pub fn matches_request(&self, r: &crate::http::RequestRecord) -> bool {
        let pid_ok = self.pids.is_empty() || r.pid.is_some_and(|p| self.pids.contains(&p));
        let comm_ok = self.comms.is_empty()
            || self
                .comms
                .iter()
                .any(|c| r.comm.as_deref() == Some(c.as_str()));
        let port_ok = self.ports.is_empty()
            || self.ports.contains(&r.local_port)
            || self.ports.contains(&r.remote_port);
        let dir_ok = self.direction.is_none_or(|d| d == r.direction);
        pid_ok && comm_ok && port_ok && dir_ok
    }

    /// A pool's record: its process, and its peer's port (pools are
    /// outbound connections).
    pub fn matches_pool(&self, r: &crate::pools::PoolRecord) -> bool {
        let pid_ok = self.pids.is_empty() || self.pids.contains(&r.pid);
        let comm_ok = self.comms.is_empty()
            || self
                .comms
                .iter()
                .any(|c| r.comm.as_deref() == Some(c.as_str()));
        let port_ok = self.ports.is_empty() || self.ports.contains(&r.peer_port);
        let dir_ok = self
            .direction
            .is_none_or(|d| d == crate::record::Direction::Outbound);
        pid_ok && comm_ok && port_ok && dir_ok
    }

    pub fn matches(&self, r: &ConnRecord) -> bool {
        let pid_ok = self.pids.is_empty() || r.pid.is_some_and(|p| self.pids.contains(&p));
        let comm_ok = self.comms.is_empty()
            || self.comms.iter().any(|c| {
                r.comm.as_deref() == Some(c.as_str())
                    || r.thread_comm.as_deref() == Some(c.as_str())
            });
        let port_ok = self.ports.is_empty()
            || self.ports.contains(&r.local_port)
            || self.ports.contains(&r.remote_port);
        let dir_ok = self.direction.is_none_or(|d| d == r.direction);
        pid_ok && comm_ok && port_ok && dir_ok
    }
}

#[cfg(test)]
mod tests {
    use observer_common::{Conn, DIR_OUTBOUND, FLAG_OWNED};

    use super::*;
    use crate::{clock::Clock, record::State};

    fn record() -> ConnRecord {
        let conn = Conn {
            pid: 42,
            comm: *b"curl\0\0\0\0\0\0\0\0\0\0\0\0",
            sport: 50000,
            dport: 8080,
            direction: DIR_OUTBOUND,
            flags: FLAG_OWNED,
            ..Conn::default()
        };
        ConnRecord::new(&conn, None, &Clock::with_offset(0), State::Open)
    }

    #[test]
    fn filters() {
        let r = record();
        assert!(Filter::default().matches(&r));
        let f = |pids: &[u32], comms: &[&str], ports: &[u16], dir| Filter {
            pids: pids.to_vec(),
            comms: comms.iter().map(|s| s.to_string()).collect(),
            ports: ports.to_vec(),
            direction: dir,
        };
        assert!(f(&[42], &[], &[], None).matches(&r));
        assert!(!f(&[43], &[], &[], None).matches(&r));
        assert!(f(&[], &["curl"], &[], None).matches(&r));
        assert!(!f(&[], &["wget"], &[], None).matches(&r));
        assert!(f(&[], &[], &[8080], None).matches(&r));
        assert!(f(&[], &[], &[50000], None).matches(&r));
        assert!(!f(&[], &[], &[443], None).matches(&r));
        assert!(f(&[], &[], &[], Some(Direction::Outbound)).matches(&r));
        assert!(!f(&[], &[], &[], Some(Direction::Inbound)).matches(&r));
        assert!(
            !f(&[42], &["curl"], &[443], None).matches(&r),
            "all must match"
        );
    }
}
